"""Reading a snapshot from the server: catalog, chunk plans, chunk SQL, binary fetches, modes.

``catalog`` (the captured tables, their columns, key and how to chunk them), ``plans`` (splitting a table
into key-range chunks), ``chunks`` (the SQL of one chunk and the parse of its rows), ``fetch`` (binary
reads through ADBC, one connection per task), ``modes`` (one short snapshot per chunk, or one shared;
pure), ``reads`` (preflight, plans, reads and the wait, as the snapshot job calls them).

May import: what the rest of ``pgpoll.source`` may (drivers, SQLAlchemy), ``pgpoll.typed`` and its own
package; never the sink or Spark.
"""
