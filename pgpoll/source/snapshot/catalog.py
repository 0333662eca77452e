"""What a snapshot reads: the captured tables, their columns and types, their key, and how to chunk them.

The snapshot must hold exactly what the change stream would have delivered
for each row, under the same table name and the same schema id as the typed
tables, so the tables and columns come from where the stream's come from:

* pgoutput: ``pg_publication_tables`` of the slot's publications -- the
  names the server publishes (leaf partitions, or the root under
  ``publish_via_partition_root``), the column list (``attnames``, every
  published column in ``attnum`` order) and the row filter (``rowfilter``,
  server SQL), exactly what the Relation messages and the server-side filter
  give the stream. Types are resolved as the decoder resolves a Relation
  message (type OID + typmod, a domain named by its base type).
* test_decoding: the user tables (leaf partitions, never a partitioned root:
  test_decoding names the leaf a change was made in), with the types and the
  identity the ingest reads from the catalog (:mod:`pgpoll.source.catalog`).

Each table's mode (one short snapshot per key-range chunk, or one shared
snapshot) is chosen by :mod:`pgpoll.source.snapshot.modes`, with the reason.
A chunked table with a published non-key column that can hold an
out-of-line TOAST value (variable length, storage not PLAIN) is *rechecked*
after its chunks (:attr:`SnapshotTable.recheck`): an UPDATE that moves a row
from a chunk not read yet into one already read leaves it in neither, and
does not carry its unchanged TOASTed values; the recheck re-reads the rows
written since the chunks' snapshots (see :mod:`pgpoll.snapshot.recheck`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2

from pgpoll.errors import ConfigError, PublicationNotFoundError
from pgpoll.source.catalog import IDENTITY_KEY_SQL, catalog_table
from pgpoll.source.names import quote_ident
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.snapshot.modes import (
    AUTO,
    CHUNKED,
    COLLATED_TYPES,
    MODES,
    SHARED,
    Collation,
    choose_mode,
    code_point_ordered,
    key_order_reproducible,
)
from pgpoll.table_patterns import TablePatterns
from pgpoll.typed.mapping import type_from_oid
from pgpoll.typed.schemas import IDENTITY_FULL, CatalogTable, ColumnSchema, TableSchema, schema_from_columns

#: pgoutput sends a Type message only for types at or above FirstGenbkiObjectId (pgoutput.c).
_FIRST_GENBKI_OID = 10000

@dataclass(frozen=True)
class SnapshotTable:
    """One table to snapshot, as the stream names and describes it.

    ``key`` is the replica-identity index's columns in index order (what
    chunk bounds compare on, by row comparison); ``()`` for a table read as
    a multiset (REPLICA IDENTITY FULL or NOTHING, no index, or a column list
    leaving a key column out). ``relfilenode`` is the table's file node (for
    a partitioned table the sum of its leaves'), compared with each chunk's.
    ``leaves`` are the partitions a shared read scans (``()`` for a plain
    table). ``schema_key`` is the key the typed tables record for this table
    (it differs from ``key`` under FULL, and in order under pgoutput).
    ``mode_reason`` says why the table got its mode (``snapshot --json``);
    ``recheck``: a chunked table whose rows can carry out-of-line TOAST
    values, re-scanned after its chunks (see the module docstring).
    """

    schema: str
    table: str
    columns: tuple[ColumnSchema, ...]
    key: tuple[str, ...]
    identity: str
    mode: str
    relfilenode: int
    row_filter: str | None = None
    column_list: tuple[str, ...] | None = None
    partitioned: bool = False
    plugin: str = "pgoutput"
    leaves: tuple[tuple[str, str], ...] = ()
    schema_key: tuple[str, ...] = ()
    warning: str | None = None
    mode_reason: str = ""
    recheck: bool = False

    @property
    def qualified_name(self) -> str:
        """``schema.table`` (unquoted, for messages)."""
        return f"{self.schema}.{self.table}"

    @property
    def quoted_name(self) -> str:
        """``schema.table`` quoted as PostgreSQL's ``quote_identifier`` would (text for ``::regclass``)."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.table)}"

    @property
    def names(self) -> tuple[str, ...]:
        """Column names in table order."""
        return tuple(c.name for c in self.columns)

    @property
    def table_schema(self) -> TableSchema:
        """The schema the typed tables compute for this table (same schema id)."""
        return TableSchema(self.schema, self.table, self.columns, self.schema_key, self.identity)

    @property
    def key_kinds(self) -> tuple[str, ...]:
        """:attr:`PgType.kind` of each key column."""
        types = {c.name: c.type.kind for c in self.columns}
        return tuple(types[k] for k in self.key)


# ---- catalog queries ---------------------------------------------------------------------

# Every catalog transaction bounds itself (and the publication view's planning needs no JIT).
_BOUND_SQL = "SELECT set_config('statement_timeout', '60000', true), set_config('jit', 'off', true)"

_PUBLICATIONS_SQL = "SELECT pubname FROM pg_publication WHERE pubname = ANY(%s)"

# pg_publication_tables: the names, column lists and filters the server publishes. Its set-returning
# function makes the planner's cost estimate cross jit_above_cost: jit is switched off locally.
_PUBLISHED_SQL = """
SELECT pt.schemaname::text, pt.tablename::text, pt.attnames::text[], pt.rowfilter
  FROM pg_publication_tables pt
 WHERE pt.pubname = ANY(%s)
 ORDER BY pt.schemaname, pt.tablename, pt.pubname
"""

_USER_TABLES_SQL = """
SELECT n.nspname::text, c.relname::text, c.relkind::text, c.relispartition,
       ARRAY(SELECT an.nspname || '.' || ac.relname
               FROM pg_partition_ancestors(c.oid) pa
               JOIN pg_class ac ON ac.oid = pa.relid JOIN pg_namespace an ON an.oid = ac.relnamespace
              WHERE pa.relid <> c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%%'
   AND n.nspname NOT LIKE 'pg\\_temp\\_%%'
 ORDER BY 1, 2
"""

_RELATION_SQL = f"""
SELECT c.oid, c.relkind::text, c.relreplident::text,
       {IDENTITY_KEY_SQL},
       COALESCE(pg_relation_filenode(c.oid)::bigint,
                (SELECT sum(pg_relation_filenode(pt.relid)::bigint) FROM pg_partition_tree(c.oid) pt WHERE pt.isleaf),
                0)::bigint,
       ARRAY(SELECT ln.nspname::text FROM pg_partition_tree(c.oid) pt JOIN pg_class lc ON lc.oid = pt.relid
               JOIN pg_namespace ln ON ln.oid = lc.relnamespace
              WHERE pt.isleaf AND lc.relkind = 'r' AND c.relkind = 'p' ORDER BY ln.nspname, lc.relname),
       ARRAY(SELECT lc.relname::text FROM pg_partition_tree(c.oid) pt JOIN pg_class lc ON lc.oid = pt.relid
               JOIN pg_namespace ln ON ln.oid = lc.relnamespace
              WHERE pt.isleaf AND lc.relkind = 'r' AND c.relkind = 'p' ORDER BY ln.nspname, lc.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s
"""

_COLUMNS_SQL = """
SELECT a.attname::text, a.atttypid::bigint, a.atttypmod, a.attgenerated::text, co.collprovider::text, co.collcollate,
       a.attlen = -1 AND a.attstorage <> 'p'
  FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""

# A type, and the base it names when it is a domain (getBaseType walks this chain).
_TYPES_SQL = """
SELECT t.oid::bigint, t.typtype::text, t.typbasetype::bigint, n.nspname::text, t.typname::text
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE t.oid = ANY(%s::oid[])
"""

_DATABASE_SQL = "SELECT datlocprovider::text, datcollate FROM pg_database WHERE datname = current_database()"


@dataclass(frozen=True)
class _Listed:
    """A table the stream names, with what the publication says of it."""

    schema: str
    table: str
    ancestors: tuple[str, ...] = ()
    attnames: tuple[str, ...] | None = None
    row_filter: str | None = None


def snapshot_tables(
    conn: Any, *, plugin: str, publications: Sequence[str], patterns: TablePatterns, mode: str = AUTO
) -> list[SnapshotTable]:
    """The tables a snapshot reads, described as the stream describes them.

    pgoutput: the publications' tables (refused with exit 2 without a
    publication; exit 4 for one that does not exist); test_decoding: the user
    tables, leaf partitions included and partitioned roots left out (a
    pattern naming a root selects its leaves). ``patterns``: every include
    pattern must select a table, else :class:`ConfigError` (exit 2, saying
    whether the table exists outside the publication). ``mode``: ``auto``
    or ``shared`` (every table under one snapshot).
    """
    try:
        listed = _published(conn, publications) if plugin == "pgoutput" else _user_tables(conn)
        chosen = _select(conn, listed, patterns, plugin, publications)
        database = _database_collation(conn)
        return [_describe(conn, item, plugin, database, mode) for item in chosen]
    except psycopg2.Error as exc:
        raise translate(exc) from None


def _published(conn: Any, publications: Sequence[str]) -> list[_Listed]:
    if not publications:
        raise ConfigError("a pgoutput slot needs a publication", "give --publication NAME[,NAME]")
    with pinned_transaction(conn) as cur:
        cur.execute(_BOUND_SQL)
        cur.execute(_PUBLICATIONS_SQL, (list(publications),))
        found = {r[0] for r in cur.fetchall()}
        missing = [p for p in publications if p not in found]
        if missing:
            raise PublicationNotFoundError(
                f'publication "{missing[0]}" does not exist',
                "create it: pgpoll publication create NAME --table schema.tbl (or check --publication)",
            )
        cur.execute(_PUBLISHED_SQL, (list(publications),))
        rows = cur.fetchall()
        merged: dict[tuple[str, str], _Listed] = {}
        for schema, table, attnames, rowfilter in rows:
            old = merged.get((schema, table))
            if old is None:
                merged[(schema, table)] = _Listed(schema, table, (), tuple(attnames or ()), rowfilter)
                continue
            # The same table in two publications: the union of their columns; rows either filter keeps.
            names = old.attnames or ()
            cols = names + tuple(a for a in attnames or () if a not in names)
            rf = None if old.row_filter is None or rowfilter is None else f"({old.row_filter}) OR ({rowfilter})"
            merged[(schema, table)] = _Listed(schema, table, (), cols, rf)
        ancestors = _ancestors(cur, list(merged))
    return [
        _Listed(i.schema, i.table, ancestors.get((i.schema, i.table), ()), i.attnames, i.row_filter)
        for i in merged.values()
    ]


def _ancestors(cur: Any, tables: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    if not tables:
        return {}
    cur.execute(_USER_TABLES_SQL)
    wanted = set(tables)
    return {(s, t): tuple(anc) for s, t, _kind, _part, anc in cur.fetchall() if (s, t) in wanted}


def _user_tables(conn: Any) -> list[_Listed]:
    with pinned_transaction(conn) as cur:
        cur.execute(_BOUND_SQL)
        cur.execute(_USER_TABLES_SQL)
        rows = cur.fetchall()
    return [_Listed(s, t, tuple(anc)) for s, t, kind, _part, anc in rows if kind == "r"]


def _matches(item: _Listed, pattern: str) -> bool:
    """A pattern selects a table by its own name or by a partitioned ancestor's (``schema.table`` or bare)."""
    for name in (f"{item.schema}.{item.table}", *item.ancestors):
        bare = name.split(".", 1)[1]
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(bare, pattern):
            return True
    return False


def _select(
    conn: Any, listed: list[_Listed], patterns: TablePatterns, plugin: str, publications: Sequence[str]
) -> list[_Listed]:
    for pattern in patterns.include:
        if any(_matches(i, pattern) for i in listed):
            continue
        if plugin == "pgoutput":
            others = [i for i in _user_tables_all(conn) if _matches(i, pattern)]
            if others:
                raise ConfigError(
                    f"table {others[0].schema}.{others[0].table} (--tables {pattern}) is not in publication "
                    f"{', '.join(publications)}",
                    "add it to the publication (ALTER PUBLICATION ... ADD TABLE), or leave it out of --tables",
                )
        raise ConfigError(
            f"--tables pattern {pattern!r} matches no {'published ' if plugin == 'pgoutput' else ''}table",
            "check the name (schema.table, or the table name; shell patterns like public.order*)",
        )
    return [
        i for i in listed
        if (not patterns.include or any(_matches(i, p) for p in patterns.include))
        and not any(_matches(i, p) for p in patterns.exclude)
    ]


def _user_tables_all(conn: Any) -> list[_Listed]:
    with pinned_transaction(conn) as cur:
        cur.execute(_BOUND_SQL)
        cur.execute(_USER_TABLES_SQL)
        return [_Listed(s, t, tuple(anc)) for s, t, _kind, _part, anc in cur.fetchall()]


def _database_collation(conn: Any) -> Collation:
    with pinned_transaction(conn) as cur:
        cur.execute(_BOUND_SQL)
        cur.execute(_DATABASE_SQL)
        provider, collate = cur.fetchone()
    return Collation(str(provider), collate)


def _base_types(cur: Any, oids: set[int]) -> dict[int, tuple[str, str]]:
    """OID -> (schema, typname) of its base type (getBaseType: a domain's chain followed to its end)."""
    known: dict[int, tuple[str, int, str, str]] = {}
    todo = set(oids)
    while todo:
        cur.execute(_TYPES_SQL, (sorted(todo),))
        rows = cur.fetchall()
        todo = set()
        for oid, typtype, basetype, nspname, typname in rows:
            known[int(oid)] = (str(typtype), int(basetype), str(nspname), str(typname))
            if typtype == "d" and int(basetype) not in known:
                todo.add(int(basetype))
    out: dict[int, tuple[str, str]] = {}
    for oid in oids:
        cur_oid = oid
        while cur_oid in known and known[cur_oid][0] == "d":
            cur_oid = known[cur_oid][1]
        if cur_oid in known:
            out[oid] = (known[cur_oid][2], known[cur_oid][3])
    return out


def _describe(conn: Any, item: _Listed, plugin: str, database: Collation, requested: str = AUTO) -> SnapshotTable:
    with pinned_transaction(conn) as cur:
        cur.execute(_BOUND_SQL)
        cur.execute(_RELATION_SQL, (item.schema, item.table))
        row = cur.fetchone()
        if row is None:
            raise ConfigError(f"table {item.schema}.{item.table} no longer exists", "check the table name")
        oid, relkind, identity, index_key, relfilenode, leaf_schemas, leaf_names = row
        cur.execute(_COLUMNS_SQL, (oid,))
        attrs = cur.fetchall()
        bases = _base_types(cur, {int(a[1]) for a in attrs})
    all_names = tuple(a[0] for a in attrs if not a[3])
    # test_decoding prints every column; pgoutput what the publication lists (all when it has no list)
    published = item.attnames if plugin == "pgoutput" and item.attnames is not None else (
        all_names if plugin == "pgoutput" else tuple(a[0] for a in attrs))
    by_name = {a[0]: a for a in attrs}
    # Before PostgreSQL 18, attnames lists stored generated columns that pgoutput never sends.
    old_server = plugin == "pgoutput" and conn.server_version < 180000
    published = tuple(n for n in (published or ()) if n in by_name and not (old_server and by_name[n][3]))
    if plugin == "pgoutput":
        type_names = {int(a[1]): bases[int(a[1])] for a in attrs if int(a[1]) >= _FIRST_GENBKI_OID and int(a[1]) in bases}
        columns = tuple(
            ColumnSchema(n, type_from_oid(int(by_name[n][1]), int(by_name[n][2]), type_names)) for n in published
        )
        index_set = set(index_key)
        schema_key = tuple(published) if identity == IDENTITY_FULL else tuple(n for n in published if n in index_set)
    else:
        described = catalog_table(conn, item.schema, item.table) or CatalogTable(identity, tuple(index_key), {})
        from_stream = [(n, described.base_types.get(n, (None, None))[0]) for n in published]
        ts = schema_from_columns(item.schema, item.table, from_stream, described)
        columns, schema_key = ts.columns, ts.key
    key: tuple[str, ...] = ()
    if identity in ("d", "i") and index_key and all(k in published for k in index_key):
        key = tuple(index_key)
    unordered = [f"{k} ({_type_words(by_name[k], bases)})" for k in key if not _reproducible(by_name[k], bases, database)]
    mode, why = choose_mode(key, str(identity), unordered, requested)
    # see the module docstring: rows can move between chunks (a key value is never an unchanged TOAST datum)
    toastable = any(by_name[n][6] for n in published if n not in index_key)
    warning = None
    if identity != IDENTITY_FULL and not key:
        warning = (
            f"{item.schema}.{item.table} has no usable replica identity (no primary key, REPLICA IDENTITY "
            "NOTHING, or a column list without the key): it is read once as a multiset, and its later UPDATEs "
            "and DELETEs cannot be matched to these rows"
        )
    return SnapshotTable(
        schema=item.schema,
        table=item.table,
        columns=columns,
        key=key,
        identity=str(identity),
        mode=mode,
        relfilenode=int(relfilenode or 0),
        row_filter=item.row_filter if plugin == "pgoutput" else None,
        column_list=published if plugin == "pgoutput" and set(published) != set(all_names) else None,
        partitioned=relkind == "p",
        plugin=plugin,
        leaves=tuple(zip(leaf_schemas or (), leaf_names or (), strict=True)),
        schema_key=schema_key,
        warning=warning,
        mode_reason=why,
        recheck=mode == CHUNKED and toastable,
    )


def _reproducible(attr: tuple[Any, ...], bases: Mapping[int, tuple[str, str]], database: Collation) -> bool:
    """Whether Spark orders this key column (a _COLUMNS_SQL row) as PostgreSQL does."""
    schema, typname = bases.get(int(attr[1]), ("", ""))
    collation = Collation(attr[4], attr[5]) if attr[4] is not None else None
    return key_order_reproducible(typname if schema == "pg_catalog" else None, collation, database)


def _type_words(attr: tuple[Any, ...], bases: Mapping[int, tuple[str, str]]) -> str:
    """A key column's type and collation, for the reason a table is shared (``text, collation en_US``)."""
    schema, typname = bases.get(int(attr[1]), ("", "?"))
    words = typname if schema == "pg_catalog" else f"{schema}.{typname}"
    if attr[4] is not None and typname in COLLATED_TYPES:
        provider = {"c": "libc", "i": "ICU", "b": "builtin", "d": "the database's"}.get(str(attr[4]), str(attr[4]))
        words += f", {provider} collation" + (f" {attr[5]}" if attr[5] else "")
    return words


def describe_table(conn: Any, schema: str, table: str, *, plugin: str, mode: str = AUTO) -> SnapshotTable:
    """One table by name, as :func:`snapshot_tables` describes it (no publication: every column, no filter)."""
    try:
        return _describe(conn, _Listed(schema, table), plugin, _database_collation(conn), mode)
    except psycopg2.Error as exc:
        raise translate(exc) from None


__all__ = [
    "AUTO", "CHUNKED", "MODES", "SHARED", "Collation", "SnapshotTable", "choose_mode", "code_point_ordered",
    "describe_table", "key_order_reproducible", "snapshot_tables",
]
