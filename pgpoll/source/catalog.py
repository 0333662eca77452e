"""Catalog lookups the stream does not answer: a table's replica identity and its columns' full types.

test_decoding prints each column's name and type but not which columns form
the replica identity; it prints the type without its modifier
(``numeric``, not ``numeric(10,2)``) and a domain's own name rather than its
base type. The ingest task asks the catalog once per table and batch. The catalog
describes the table *now*, which can differ from when an older change was
made; pgpoll uses it only for what the stream cannot say.

Both queries run in one read-only transaction with the pinned settings, and
server errors become pgpoll errors (so the Spark task reports them with
their own exit code, not as "batch task failed").
"""

from __future__ import annotations

from typing import Any

import psycopg2

from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.typed.schemas import CatalogTable

#: The replica-identity key of ``pg_class c`` (the primary key, or the REPLICA IDENTITY USING INDEX index),
#: its columns in index order; ``{}`` under FULL or NOTHING. A SQL expression, shared with the snapshot's catalog.
IDENTITY_KEY_SQL = """COALESCE((SELECT array_agg(a.attname::text ORDER BY k.ord)
                   FROM pg_index i
                   CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  WHERE i.indrelid = c.oid
                    AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END),
                '{}')"""

_TABLE_SQL = f"""
SELECT c.oid, c.relreplident,
       {IDENTITY_KEY_SQL}
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s
"""

_COLUMNS_SQL = """
SELECT a.attname::text, format_type(a.atttypid, NULL),
       CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod)
            ELSE format_type(a.atttypid, a.atttypmod) END
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""


def catalog_table(conn: Any, schema: str, table: str) -> CatalogTable | None:
    """The table's replica identity, key columns and full column types; None when it no longer exists."""
    try:
        with pinned_transaction(conn) as cur:
            cur.execute(_TABLE_SQL, (schema, table))
            row = cur.fetchone()
            if row is None:
                return None
            oid, identity, key = row
            cur.execute(_COLUMNS_SQL, (oid,))
            bases = {name: (declared, base) for name, declared, base in cur.fetchall()}
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return CatalogTable(identity=str(identity), key=tuple(key), base_types=bases)
