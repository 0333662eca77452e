"""Typed columns: PostgreSQL types to Arrow / Spark types, and value text to typed values.

* :mod:`pgpoll.typed.mapping` -- :class:`~pgpoll.typed.mapping.PgType` (what a
  column's type is, built from pgoutput's type OID and typmod or from
  test_decoding's printed type name) and the one table that maps it to an
  Arrow type and a Spark SQL type.
* :mod:`pgpoll.typed.conversions` -- the output-function text of one value (as
  both plugins give it, under pgpoll's pinned session settings) to a Python
  value or a whole Arrow array, with the rows the typed type cannot hold
  reported as fallbacks (their exact text is kept elsewhere).

Both modules are pure: no I/O, no catalog queries.
"""
