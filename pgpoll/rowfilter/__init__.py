"""Client-side publication row filters, for the test_decoding plugin.

With pgoutput, PostgreSQL (15+) applies a publication's row filters on the
server. test_decoding filters nothing, so ``pgpoll ingest --row-filter
'schema.tbl: (expr)'`` applies the same rules on the client:

* :mod:`pgpoll.rowfilter.expression` parses a spec (tokens from
  :mod:`pgpoll.rowfilter.tokens`) into a frozen AST (:mod:`pgpoll.rowfilter.nodes`),
  refusing everything outside the subset;
* :mod:`pgpoll.rowfilter.operands` turns text values and constants into keys
  that compare the way PostgreSQL compares them;
* :mod:`pgpoll.rowfilter.evaluate` evaluates it on a change's text values
  with SQL three-valued logic and PostgreSQL's UPDATE transformation;
* :mod:`pgpoll.source.row_filter_check` checks the filters against the
  catalog at start-up (table, columns, replica identity, types).
"""

from __future__ import annotations

from pgpoll.rowfilter.evaluate import TableFilters
from pgpoll.rowfilter.expression import RowFilter, parse_row_filter

__all__ = ["RowFilter", "TableFilters", "parse_row_filter"]
