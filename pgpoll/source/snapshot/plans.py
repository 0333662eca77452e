"""Chunk plans of a snapshot: how a table is split into chunks, and how large a chunk is.

A chunked table is split by its replica-identity key (``lo < key <= hi``,
row comparison, open first and last ends) at boundaries found by keyset
probes: each probe reads ``chunk_rows`` index entries past the previous
boundary in a short transaction with a ``statement_timeout`` (no deep
OFFSET from the start, no full-table NTILE); a table of many chunks by its
statistics from the key's histogram (one-column keys, fresh statistics) or
at the quantiles of a block sample of its keys (:func:`_sampled_chunks`). A table read under one shared
snapshot is split by ctid block ranges per leaf relation (TID range scans);
the last range of each leaf is open, so rows in blocks added after the plan
are read too. Key values travel as JSON (int for integers, the server's
text otherwise) and come back as untyped literals, which take each key
column's own type in the row comparison.

Chunks are at most ``chunk_rows`` rows and, with ``chunk_seconds``, about that
long to read (:func:`chunk_rows_for`). The statements that read one chunk are
:mod:`pgpoll.source.snapshot.chunks`' (which re-exports everything public here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2 import sql

from pgpoll.source.names import double_quote, parse_qualified_name, quote_ident
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.snapshot.catalog import CHUNKED, SnapshotTable

PROBE_TIMEOUT_MS = 60_000
_DEFAULT_ROWS_PER_BLOCK = 50  # no statistics yet: about 160-byte rows
#: What one chunk's connection reads per second, counted in stored bytes (heap and TOAST), set low: the
#: 2M-row benchmark table reads at about 130 MB/s here. ``--chunk-seconds`` times this bounds a chunk's bytes.
READ_BYTES_PER_S = 50_000_000
#: The fewest rows a chunk is planned with, however wide the rows (probes and tasks have a fixed cost).
MIN_CHUNK_ROWS = 1_000


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk of a table's plan.

    Mode chunked: rows with ``lo < key <= hi`` (row comparison; ``None`` = open
    end), key values as JSON values (int for integers, text otherwise, bytea
    as ``\\x...`` hex). Mode shared: ``relation`` (schema, leaf) and ``blocks``
    ``(first, end)`` -- ctid blocks ``first <= block < end``, ``end`` None for
    the last range of a leaf; neither set: the whole table.
    """

    n: int
    lo: tuple[Any, ...] | None = None
    hi: tuple[Any, ...] | None = None
    relation: tuple[str, str] | None = None
    blocks: tuple[int, int | None] | None = None

    def to_json(self) -> dict[str, Any]:
        """The plan.json form of this chunk."""
        if self.relation is not None or self.blocks is not None:
            return {
                "n": self.n,
                "relation": None if self.relation is None else f"{quote_ident(self.relation[0])}.{quote_ident(self.relation[1])}",
                "blocks": None if self.blocks is None else list(self.blocks),
            }
        return {"n": self.n, "lo": None if self.lo is None else list(self.lo),
                "hi": None if self.hi is None else list(self.hi)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> ChunkSpec:
        """The inverse of :meth:`to_json`."""
        if "relation" in data or "blocks" in data:
            rel = data.get("relation")
            name = parse_qualified_name(rel)[0] if rel else None
            blocks = data.get("blocks")
            return ChunkSpec(
                int(data["n"]),
                relation=None if name is None else (name.schema, name.table),
                blocks=None if blocks is None else (int(blocks[0]), None if blocks[1] is None else int(blocks[1])),
            )
        lo, hi = data.get("lo"), data.get("hi")
        return ChunkSpec(int(data["n"]), None if lo is None else tuple(lo), None if hi is None else tuple(hi))


def _relation_sql(t: SnapshotTable, relation: tuple[str, str] | None = None) -> sql.Composable:
    """The FROM target: ``ONLY "s"."t"`` for a plain table or a leaf (its inheritance children are other
    tables in the stream), the partitioned root itself (its rows are its leaves')."""
    if relation is not None:
        return sql.SQL("ONLY {}.{}").format(sql.Identifier(relation[0]), sql.Identifier(relation[1]))
    name = sql.SQL("{}.{}").format(sql.Identifier(t.schema), sql.Identifier(t.table))
    return name if t.partitioned else sql.SQL("ONLY ") + name


def relation_text(t: SnapshotTable, relation: tuple[str, str] | None = None) -> str:
    """The FROM target as text: ``ONLY "s"."t"`` for a plain table or a leaf, the partitioned root itself."""
    if relation is not None:
        return f"ONLY {double_quote(relation[0])}.{double_quote(relation[1])}"
    name = f"{double_quote(t.schema)}.{double_quote(t.table)}"
    return name if t.partitioned else "ONLY " + name


def _key_sql(t: SnapshotTable) -> sql.Composable:
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k) for k in t.key))


def _bound(values: tuple[Any, ...]) -> sql.Composable:
    # Bound as untyped literals: each takes its key column's type (row comparison resolves per column).
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(str(v)) for v in values))


def _json_key(kind: str, text: str) -> Any:
    return int(text) if kind in ("int2", "int4", "int8") else text


def set_timeout(cur: Any, ms: int) -> None:
    """``statement_timeout`` for the rest of the cursor's transaction."""
    cur.execute("SELECT set_config('statement_timeout', %s, true)", (str(int(ms)),))


def plan_chunks(conn: Any, t: SnapshotTable, chunk_rows: int, *, timeout_ms: int = PROBE_TIMEOUT_MS,
                chunk_seconds: float | None = None) -> list[ChunkSpec]:
    """The chunks of ``t``: key ranges by keyset probes (chunked), ctid block ranges per leaf (shared).

    ``chunk_seconds`` bounds a chunk's rows further, so that it reads in
    about that long: :func:`chunk_rows_for` of the table's stored bytes per row.
    """
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be at least 1")
    try:
        if chunk_seconds is not None:
            chunk_rows = chunk_rows_for(chunk_rows, chunk_seconds, row_bytes(conn, t))
        return _key_chunks(conn, t, chunk_rows, timeout_ms) if t.mode == CHUNKED else _block_chunks(conn, t, chunk_rows)
    except psycopg2.Error as exc:
        raise translate(exc) from None


def chunk_rows_for(chunk_rows: int, chunk_seconds: float, bytes_per_row: float | None) -> int:
    """Rows per chunk: at most ``chunk_rows``, and at most what reads in ``chunk_seconds`` at
    :data:`READ_BYTES_PER_S` (never below :data:`MIN_CHUNK_ROWS`; unknown row size: ``chunk_rows``)."""
    if not bytes_per_row or bytes_per_row <= 0:
        return chunk_rows
    by_time = int(chunk_seconds * READ_BYTES_PER_S / bytes_per_row)
    return max(1, min(chunk_rows, max(MIN_CHUNK_ROWS, by_time)))


# Stored bytes per row (heap and TOAST, leaves of a partitioned table), from the statistics VACUUM and
# ANALYZE keep (NULL before the first of them: the row count is unknown).
_ROW_BYTES_SQL = """
SELECT sum(pg_relation_size(c.oid) + CASE WHEN c.reltoastrelid <> 0 THEN pg_relation_size(c.reltoastrelid) ELSE 0 END)::float8
       / NULLIF(sum(GREATEST(c.reltuples, 0)), 0)
  FROM pg_class c
 WHERE c.relkind = 'r' AND (c.oid = %s::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree(%s::regclass) WHERE isleaf))
"""


def row_bytes(conn: Any, t: SnapshotTable) -> float | None:
    """The table's average stored row size in bytes (None when unknown)."""
    with pinned_transaction(conn) as cur:
        set_timeout(cur, PROBE_TIMEOUT_MS)
        cur.execute(_ROW_BYTES_SQL, (t.quoted_name, t.quoted_name))
        row = cur.fetchone()
    return float(row[0]) if row is not None and row[0] is not None else None


#: From this many chunks on, a table's boundaries come from a sample of its keys, not from probes.
SAMPLE_FROM_CHUNKS = 8
#: Pages sampled per chunk planned: enough that chunk sizes stay within a few tens of percent of the plan.
SAMPLE_PAGES_PER_CHUNK = 40

# The table's pages and rows now (the statistics' rows per page times its current size, as the planner
# estimates), and whether ANALYZE's statistics still describe it (at most a tenth of the rows changed since).
_SIZE_SQL = """
SELECT sum(pg_relation_size(c.oid) / current_setting('block_size')::int)::float8,
       sum(CASE WHEN c.relpages > 0 THEN GREATEST(c.reltuples, 0) / c.relpages
                * (pg_relation_size(c.oid) / current_setting('block_size')::int) ELSE 0 END)::float8,
       bool_and(COALESCE(s.n_mod_since_analyze <= GREATEST(c.reltuples, 0) / 10 AND s.last_analyze IS NOT NULL
                         OR s.last_autoanalyze IS NOT NULL AND s.n_mod_since_analyze <= GREATEST(c.reltuples, 0) / 10,
                         false))
  FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
 WHERE c.relkind = 'r' AND (c.oid = %s::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree(%s::regclass) WHERE isleaf))
"""

# The key column's histogram (ANALYZE's equal-depth sample of the whole table), as the column's own text.
_HISTOGRAM_SQL = """
SELECT histogram_bounds::text::text[], null_frac FROM pg_stats
 WHERE schemaname = %s AND tablename = %s AND attname = %s AND NOT inherited
"""


def _key_chunks(conn: Any, t: SnapshotTable, chunk_rows: int, timeout_ms: int) -> list[ChunkSpec]:
    with pinned_transaction(conn) as cur:
        set_timeout(cur, timeout_ms)
        cur.execute(_SIZE_SQL, (t.quoted_name, t.quoted_name))
        row = cur.fetchone()
    pages, tuples, analyzed = (float(row[0] or 0), float(row[1] or 0), bool(row[2])) if row else (0.0, 0.0, False)
    wanted = int(tuples // chunk_rows) + 1
    if wanted >= SAMPLE_FROM_CHUNKS and pages >= 1:
        found = _histogram_chunks(conn, t, wanted, timeout_ms) if analyzed and not t.partitioned else None
        found = found or _sampled_chunks(conn, t, wanted, pages, timeout_ms)
        if found is not None:
            return found
    return _probed_chunks(conn, t, chunk_rows, timeout_ms)


def _chunks_between(bounds: list[tuple[Any, ...]]) -> list[ChunkSpec] | None:
    """Chunks ending at each of ``bounds`` (ascending, repeats dropped), then one open chunk."""
    chunks: list[ChunkSpec] = []
    lo: tuple[Any, ...] | None = None
    for hi in bounds:
        if hi == lo:
            continue
        chunks.append(ChunkSpec(len(chunks), lo, hi))
        lo = hi
    chunks.append(ChunkSpec(len(chunks), lo, None))
    return chunks if len(chunks) > 1 else None


def _histogram_chunks(conn: Any, t: SnapshotTable, wanted: int, timeout_ms: int) -> list[ChunkSpec] | None:
    """A one-column key's boundaries from ANALYZE's histogram: free, and equal-depth over the whole table.

    Integer keys finer than the histogram's buckets are cut evenly inside a
    bucket; other kinds need no more chunks than buckets (else None: sample).
    """
    if len(t.key) != 1:
        return None
    with pinned_transaction(conn) as cur:
        set_timeout(cur, timeout_ms)
        cur.execute(_HISTOGRAM_SQL, (t.schema, t.table, t.key[0]))
        row = cur.fetchone()
    if row is None or not row[0] or len(row[0]) < 3 or float(row[1] or 0) > 0:
        return None
    kind, values = t.key_kinds[0], list(row[0])
    buckets = len(values) - 1
    if kind in ("int2", "int4", "int8"):
        ints = [int(v) for v in values]
        bounds = []
        for i in range(1, wanted):
            position = i * buckets / wanted  # the i-th quantile, in buckets
            b = min(int(position), buckets - 1)
            bounds.append((ints[b] + int((ints[b + 1] - ints[b]) * (position - b)),))
        return _chunks_between(bounds)
    if wanted > buckets:
        return None
    return _chunks_between([(_json_key(kind, values[round(i * buckets / wanted)]),) for i in range(1, wanted)])


def _sampled_chunks(conn: Any, t: SnapshotTable, wanted: int, pages: float, timeout_ms: int) -> list[ChunkSpec] | None:
    """Boundaries at the quantiles of a block sample of the keys (``TABLESAMPLE SYSTEM``): ``wanted`` chunks of a
    table of ``pages`` pages (None: probe instead).

    Why: a probe reads ``chunk_rows`` index entries, so probing a whole table
    reads its whole index before the first chunk (a quarter of a second per
    2M rows); a sample of :data:`SAMPLE_PAGES_PER_CHUNK` pages per chunk
    reads a few percent of it. Chunk sizes are then about ``chunk_rows``, not
    at most: the ranges still tile the key space (first and last open).
    """
    with pinned_transaction(conn) as cur:
        set_timeout(cur, timeout_ms)
        percent = min(100.0, 100.0 * SAMPLE_PAGES_PER_CHUNK * wanted / pages)
        keys = ", ".join(double_quote(k) for k in t.key)
        texts = ", ".join(f"{double_quote(k)}::text" for k in t.key)
        down = ", ".join(f"{double_quote(k)} DESC" for k in t.key)
        cur.execute(
            f"SELECT DISTINCT ON (__pgpoll_b) {texts} FROM (SELECT {keys}, ntile({wanted}) OVER (ORDER BY {keys}) AS "
            f"__pgpoll_b FROM {relation_text(t)} TABLESAMPLE SYSTEM ({percent:.6f}) REPEATABLE (0)) s "
            f"ORDER BY __pgpoll_b, {down}")
        rows = cur.fetchall()
    # each tile's largest key ends a chunk; the last chunk is open
    return _chunks_between([tuple(_json_key(k, v) for k, v in zip(t.key_kinds, row, strict=True)) for row in rows[:-1]])


def _probed_chunks(conn: Any, t: SnapshotTable, chunk_rows: int, timeout_ms: int) -> list[ChunkSpec]:
    kinds = t.key_kinds
    key = _key_sql(t)
    select = sql.SQL("SELECT {} FROM {}").format(
        # aliased: ORDER BY "k" must sort by the column, not by an output column of that name (its text)
        sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"__pgpoll_k{i}"))
                           for i, k in enumerate(t.key)),
        _relation_sql(t))
    # Every value is a literal in the text and no parameters are passed: a '%' in a key stays a '%'.
    order = sql.SQL(" ORDER BY {} OFFSET {} LIMIT 1").format(
        sql.SQL(", ").join(sql.Identifier(k) for k in t.key), sql.Literal(chunk_rows - 1))
    chunks: list[ChunkSpec] = []
    lo: tuple[Any, ...] | None = None
    while True:
        where = sql.SQL("") if lo is None else sql.SQL(" WHERE {} > {}").format(key, _bound(lo))
        with pinned_transaction(conn) as cur:
            set_timeout(cur, timeout_ms)
            cur.execute(select + where + order)
            row = cur.fetchone()
        if row is None:
            chunks.append(ChunkSpec(len(chunks), lo, None))
            return chunks
        hi = tuple(_json_key(k, v) for k, v in zip(kinds, row, strict=True))
        chunks.append(ChunkSpec(len(chunks), lo, hi))
        lo = hi


_BLOCKS_SQL = """
SELECT c.relpages, c.reltuples, pg_relation_size(c.oid) / current_setting('block_size')::bigint
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s
"""


def _block_chunks(conn: Any, t: SnapshotTable, chunk_rows: int) -> list[ChunkSpec]:
    relations = list(t.leaves) if t.partitioned else [(t.schema, t.table)]
    if not relations:
        return [ChunkSpec(0)]
    chunks: list[ChunkSpec] = []
    with pinned_transaction(conn) as cur:
        set_timeout(cur, PROBE_TIMEOUT_MS)
        for rel in relations:
            cur.execute(_BLOCKS_SQL, rel)
            row = cur.fetchone()
            relpages, reltuples, nblocks = row if row is not None else (0, -1, 0)
            per_block = reltuples / relpages if relpages and reltuples and reltuples > 0 else _DEFAULT_ROWS_PER_BLOCK
            step = max(1, int(chunk_rows / max(per_block, 1.0)))
            first = 0
            while True:
                end = first + step
                if end >= int(nblocks):
                    chunks.append(ChunkSpec(len(chunks), relation=rel, blocks=(first, None)))
                    break
                chunks.append(ChunkSpec(len(chunks), relation=rel, blocks=(first, end)))
                first = end
    return chunks
