"""Start-up checks of ``--row-filter`` filters against the catalog.

For each filtered table: it must exist and be a plain table (a partitioned
table is refused: test_decoding reports each change under its partition's
name, so filters go on the partitions, as PostgreSQL does with
``publish_via_partition_root = false``); every column the filter reads must be
a column of it; the filter's constants must fit the columns' types; and, as
PostgreSQL refuses for a publication that publishes UPDATE or DELETE
(``pub_rf_contains_invalid_column`` in ``publicationcmds.c``), the filter may
only read replica identity columns unless the identity is FULL (DEFAULT: the
primary key; USING INDEX: that index's columns; NOTHING: none) — the old row
of an UPDATE or DELETE carries only those columns.

Names are always bound as parameters; nothing from the filter text reaches SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg2

from pgpoll.errors import ConfigError
from pgpoll.rowfilter.evaluate import TableFilters
from pgpoll.rowfilter.expression import RowFilter, parse_row_filter
from pgpoll.source.names import double_quote
from pgpoll.source.server_errors import translate

__all__ = ["check_row_filters", "checked_client_row_filters"]

_TABLE = """
SELECT c.oid, c.relkind, c.relreplident
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
_COLUMNS = """
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# The replica identity key, in index order (what INDEX_ATTR_BITMAP_IDENTITY_KEY holds).
_KEY = """
SELECT a.attname
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND ((%s = 'd' AND i.indisprimary) OR (%s = 'i' AND i.indisreplident))
ORDER BY k.ord
"""
_IDENTITY = {"d": "DEFAULT", "i": "USING INDEX", "n": "NOTHING", "f": "FULL"}


def check_row_filters(conn: Any, filters: Sequence[RowFilter]) -> dict[tuple[str, str], tuple[str, ...]]:
    """Check ``filters`` against the catalog; return ``{(schema, table): key columns}``.

    The key columns are the replica identity key (all columns for FULL).
    Raises :class:`ConfigError` naming the table or column at fault, with the fix.
    """
    grouped = TableFilters(filters)
    result: dict[tuple[str, str], tuple[str, ...]] = {}
    try:
        with conn.cursor() as cur:
            for schema, table in grouped.tables():
                result[(schema, table)] = _check_table(cur, grouped, schema, table)
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return result


def _check_table(cur: Any, grouped: TableFilters, schema: str, table: str) -> tuple[str, ...]:
    shown = f"{double_quote(schema)}.{double_quote(table)}"
    cur.execute(_TABLE, (schema, table))
    row = cur.fetchone()
    if row is None:
        raise ConfigError(
            f"row filter: table {schema}.{table} does not exist",
            "check the name (unquoted names are lower-cased; quote mixed case as \"Name\")",
            relation=f"{schema}.{table}",
        )
    oid, relkind, identity = row
    if relkind == "p":
        raise ConfigError(
            f"row filter: {schema}.{table} is a partitioned table; test_decoding reports changes under each partition",
            "give one --row-filter per partition (as PostgreSQL does with publish_via_partition_root = false)",
            relation=f"{schema}.{table}",
        )
    if relkind != "r":
        raise ConfigError(f"row filter: {schema}.{table} is not a table", "filter a table",
                          relation=f"{schema}.{table}")
    cur.execute(_COLUMNS, (oid,))
    types = {name: type_name for name, type_name in cur.fetchall()}
    used: set[str] = set()
    for row_filter in grouped.filters_for(schema, table):
        for column in sorted(row_filter.columns()):
            if column not in types:
                raise ConfigError(
                    f"row filter {row_filter.text}: column {column} does not exist in {schema}.{table}",
                    f"use one of: {', '.join(types) or '(no columns)'} (quote mixed case as \"Name\")",
                    relation=f"{schema}.{table}",
                )
        used |= row_filter.columns()
    grouped.check_types(schema, table, types)
    if identity == "f":
        return tuple(types)
    cur.execute(_KEY, (oid, identity, identity))
    key = tuple(name for (name,) in cur.fetchall())
    outside = sorted(used - set(key))
    if outside:
        what = {"d": "its primary key" if key else "no primary key", "i": "its replica identity index",
                "n": "no columns"}.get(identity, "its key")
        raise ConfigError(
            f"row filter on {schema}.{table} uses {', '.join(outside)}, outside the replica identity "
            f"(REPLICA IDENTITY {_IDENTITY.get(identity, identity)}: {what}{': ' + ', '.join(key) if key else ''}); "
            "the old row of an UPDATE or DELETE carries only the key, so the filter cannot be evaluated on it",
            f"ALTER TABLE {shown} REPLICA IDENTITY FULL, or filter on key columns only",
            relation=f"{schema}.{table}",
        )
    return key


def checked_client_row_filters(conn: Any, plugin: str, specs: Sequence[str]) -> list[RowFilter]:
    """``--row-filter`` specs parsed and checked for a slot of ``plugin`` (ingest's and snapshot's rule).

    Client-side filters are for test_decoding slots only: with pgoutput the
    server applies the publication's own row filters, so a filter here would
    be a second, silently different one.
    """
    if plugin != "test_decoding":
        raise ConfigError(
            "--row-filter is for test_decoding slots; with pgoutput the server applies publication row filters",
            "put the filter on the publication: pgpoll publication create NAME --table 'schema.tbl WHERE (expr)'",
        )
    filters = [parse_row_filter(spec) for spec in specs]
    check_row_filters(conn, filters)
    return filters
