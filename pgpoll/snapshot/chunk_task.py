"""One chunk of a snapshot, inside a Spark task: read it, type it as the typed tables do, write it, publish it.

The task reads the chunk in its own short transaction: in binary through
ADBC (:class:`pgpoll.source.snapshot.fetch.BinaryChunkReader`, one
connection for all the chunks of the task's partition), or, where ADBC is
not installed or ``PGPOLL_FETCH=psycopg2``, as CSV text through psycopg2
(:func:`pgpoll.source.snapshot.reads.stream_chunk`). It converts each column
exactly as the typed tables do (:func:`pgpoll.typed.native_values.native_to_typed`
for values read in binary, :func:`pgpoll.sink.typed_columns.column_to_arrow`
for text, under the physical names a fresh :class:`~pgpoll.typed.rows.ColumnLedger`
gives this one table shape; what a typed column cannot hold keeps its exact
text in ``_untyped``), writes one Parquet file as an *attempt*
(:func:`write_batches`, the one place that writes data), and publishes it
through :class:`~pgpoll.sink.snapshot_store.SnapshotStore` (manifest created
exclusively, then the final name). A retried or speculative task that loses
the manifest race deletes its attempt: harmless.

A *recheck* piece (:mod:`pgpoll.snapshot.recheck`) is read the same way: a
block range of the table, only the rows written since ``recheck_since``.

pgpoll's own errors come back in the result (they pickle with their class,
so a lock timeout still exits 4 on the driver); anything else fails the task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from pgpoll.errors import PgpollError
from pgpoll.sink import layout
from pgpoll.typed.schemas import TableSchema

if TYPE_CHECKING:
    from pgpoll.sink.stores.output_fs import OutputFs
    from pgpoll.source.snapshot.catalog import SnapshotTable
    from pgpoll.source.snapshot.reads import ChunkSpec, ChunkStream

log = logging.getLogger("pgpoll.snapshot")

_UNTYPED = pa.map_(pa.string(), pa.string())
LOCK_ATTEMPTS = 4  # reads of a chunk whose LOCK TABLE timed out, before the run stops (exit 4)
LOCK_BACKOFF_S = 1.0  # doubled after each timed-out attempt
#: Tests only: a directory where each task, before reading chunk ``n`` of ``dir``, creates ``<dir>.<n>.ready`` and
#: waits (at most PAUSE_LIMIT_S) for ``<dir>.<n>.go``, so a test can change rows between two chunks' reads. Read
#: by the driver, which passes it to the tasks; unset in every real run.
PAUSE_ENV = "PGPOLL_SNAPSHOT_TEST_PAUSE_DIR"
PAUSE_LIMIT_S = 300.0


@dataclass(frozen=True)
class ChunkWork:
    """Everything a task needs for one chunk (pickled to the executor)."""

    dsn: str
    output: str
    snapshot_id: str
    table: SnapshotTable
    chunk: ChunkSpec
    lock_timeout_ms: int
    exported: str | None = None  # shared mode: the exported snapshot the task imports
    exported_relfilenode: int | None = None  # shared mode: the table's file node when that snapshot was taken
    row_filters: tuple[str, ...] = ()  # --row-filter specs (test_decoding), applied on the text values
    plan_relfilenode: int | None = None
    recheck_since: int | None = None  # a recheck piece: only rows written by this transaction id or later
    pause_dir: str | None = None  # tests only (PAUSE_ENV): wait for a go-ahead file before reading
    fetch: str = "auto"  # PGPOLL_FETCH as the driver read it (pgpoll.source.arrow_peek.requested_fetch)
    fs: OutputFs | None = None  # the output with the driver's store settings (an object store's credentials travel here)

    def __repr__(self) -> str:  # never show the DSN or a store's secret
        return f"ChunkWork({self.snapshot_id!r}, {self.table_dir!r}, chunk {self.chunk.n})"

    @property
    def table_dir(self) -> str:
        """The table's directory name in the snapshot."""
        return layout.table_dir_name(self.table.schema, self.table.table)


@dataclass(frozen=True)
class ChunkResult:
    """What a task reports for one chunk."""

    table_dir: str
    n: int
    rows: int = 0
    bytes: int = 0
    won: bool = False
    xip: tuple[int, ...] = ()
    held_s: float = 0.0
    error: PgpollError | None = field(default=None, compare=False)


def typed_chunk(values: pa.Table, schema: TableSchema, native: Sequence[bool] = ()) -> pa.Table:
    """A chunk's columns -> its typed columns + ``_untyped`` + ``_schema_id`` (the typed tables' conversion).

    ``native`` names (by position in ``schema.columns``) the columns read in
    binary; the others hold the server's text of each value.
    """
    from pgpoll.sink.typed_columns import column_to_arrow
    from pgpoll.typed.native_values import native_to_typed
    from pgpoll.typed.rows import ColumnLedger, TypedLayout

    typed_layout = TypedLayout.build([schema], ColumnLedger())
    n = values.num_rows
    binary = {c.name for c, flag in zip(schema.columns, native, strict=False) if flag}
    arrays: list[pa.Array[Any]] = []
    fields: list[pa.Field[Any]] = []
    untyped: dict[int, list[tuple[str, str]]] = {}
    own = typed_layout.arrow_schema()
    for i, (phys, name, t) in enumerate(typed_layout.columns):
        column: Any = values.column(name)
        value_array: pa.Array[Any] = (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
        texts: dict[int, str] = {}
        if name in binary:
            array, texts = native_to_typed(t, value_array)
        else:
            if value_array.type != pa.string():
                value_array = value_array.cast(pa.string())
            array, fallback = column_to_arrow(t, value_array)
            for row in fallback:
                text = value_array[row].as_py()
                if text is not None:
                    texts[row] = text
        for row, text in texts.items():
            untyped.setdefault(row, []).append((name, text))
        arrays.append(array)
        fields.append(own.field(i))
        assert own.field(i).name == phys
    arrays.append(pa.array([untyped.get(i) for i in range(n)], _UNTYPED) if untyped else pa.nulls(n, _UNTYPED))
    fields.append(pa.field("_untyped", _UNTYPED))
    arrays.append(pa.repeat(pa.scalar(schema.schema_id, pa.string()), n))
    fields.append(pa.field("_schema_id", pa.string()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def filter_rows(texts: pa.Table, schema: TableSchema, specs: tuple[str, ...]) -> pa.Table:
    """The rows a client-side ``--row-filter`` keeps (as for an INSERT of the row; test_decoding only)."""
    from pgpoll.rowfilter import TableFilters, parse_row_filter

    filters = TableFilters([parse_row_filter(s) for s in specs])
    if not filters.applies_to(schema.schema, schema.table) or texts.num_rows == 0:
        return texts
    types = {c.name: c.type.declared for c in schema.columns}
    keep = [
        filters.transform("I", schema.schema, schema.table, None, row, types) is not None
        for row in texts.to_pylist()
    ]
    return texts.filter(pa.array(keep, pa.bool_()))


class ChunkSource:
    """Where a task's chunks are read from: one ADBC connection for all of them (binary), or psycopg2 (CSV text).

    ``fetch`` (``PGPOLL_FETCH`` as the driver read it) chooses as for
    ingest's peek (``auto``: ADBC where it is installed and connects;
    ``psycopg2``: CSV). Closed by the task.
    """

    def __init__(self, dsn: str, fetch: str = "auto") -> None:
        from pgpoll.source.arrow_peek import ADBC, FetchUnavailableError, choose_fetch

        self.dsn = dsn
        self.binary: Any = None
        if choose_fetch("pgoutput", fetch) == ADBC:
            from pgpoll.source.snapshot.fetch import BinaryChunkReader

            try:
                self.binary = BinaryChunkReader(dsn)
            except FetchUnavailableError as exc:
                log.warning("reading snapshot chunks as CSV through psycopg2: ADBC cannot connect (%s)", exc)

    def open(self, work: ChunkWork) -> contextlib.AbstractContextManager[ChunkStream]:
        """One attempt at one chunk (the lock and the snapshot are taken on entering)."""
        from pgpoll.source.snapshot.chunks import written_since
        from pgpoll.source.snapshot.reads import stream_chunk

        extra = () if work.recheck_since is None else (written_since(work.recheck_since),)
        if self.binary is not None and not work.row_filters:  # (a client-side row filter reads the values' text)
            return cast("contextlib.AbstractContextManager[ChunkStream]", self.binary.chunk(
                work.table, work.chunk, lock_timeout_ms=work.lock_timeout_ms, exported=work.exported,
                exported_relfilenode=work.exported_relfilenode, extra=extra))
        return stream_chunk(work.dsn, work.table, work.chunk, lock_timeout_ms=work.lock_timeout_ms,
                            exported=work.exported, exported_relfilenode=work.exported_relfilenode, extra=extra)

    def close(self) -> None:
        """Close the ADBC connection, if any."""
        if self.binary is not None:
            self.binary.close()
            self.binary = None


@contextlib.contextmanager
def _open(work: ChunkWork, source: ChunkSource) -> Iterator[ChunkStream]:
    """One chunk's stream with bounded retries of a lock timeout (then its error: exit 4, naming the blocker)."""
    from pgpoll.errors import LockTimeoutError

    wait = LOCK_BACKOFF_S
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        with contextlib.ExitStack() as stack:
            try:  # the lock and the snapshot are taken on entering
                stream = stack.enter_context(source.open(work))
            except LockTimeoutError as exc:
                if attempt == LOCK_ATTEMPTS:
                    raise
                log.warning("chunk %d of %s: %s; trying again in %.0f s (attempt %d of %d)",
                            work.chunk.n, work.table_dir, exc.message, wait, attempt + 1, LOCK_ATTEMPTS)
                time.sleep(wait)
                wait *= 2
                continue
            yield stream
            return
    raise AssertionError("unreachable")  # pragma: no cover


def write_batches(path: str, tables: Iterable[pa.Table], empty: pa.Table, fs: OutputFs | None = None,
                  statistics: Sequence[str] = ()) -> None:
    """Write a chunk's typed tables to its attempt file at ``path`` (of ``fs``, the output; None: a local path),
    as they come (``empty``: the columns, for a chunk without rows). The one step that writes a chunk's data; on
    an object store the file is one upload, there whole once closed, or not at all.

    No dictionary encoding but for ``_schema_id`` (one value): its buffers grew with the chunk's rows (measured).
    Column statistics only for the ``statistics`` columns (the key's physical names): a snapshot file is always
    read whole (materialize filters nothing by min/max), and the other columns' statistics, the strings' above
    all, were a quarter of the writer's CPU (measured on the benchmark table: 0.37 s against 0.28 s per 2M rows).
    """
    import pyarrow.parquet as pq

    where: dict[str, Any] = {} if fs is None else {"filesystem": fs.arrow()}
    target = path if fs is None else fs.arrow_path(path)
    # (the stubs say bool; pyarrow takes a list of columns for both)
    only: Any = ["_schema_id"]
    stats: Any = list(statistics)
    writer: Any = None
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(target, table.schema, use_dictionary=only, write_statistics=stats, **where)
            writer.write_table(table if table.schema == writer.schema else table.cast(writer.schema))
        if writer is None:
            writer = pq.ParquetWriter(target, empty.schema, write_statistics=stats, **where)
            writer.write_table(empty)
    finally:
        if writer is not None:
            writer.close()


def write_chunk(work: ChunkWork, path: str, source: ChunkSource | None = None,
                fs: OutputFs | None = None) -> tuple[ChunkStream, int, float]:
    """Read the chunk into one Parquet file at ``path`` (of ``fs``; None: a local path), batch by batch.

    Returns the stream, the row count, and how long the chunk's snapshot was
    held (from the snapshot to the end of the read).
    """
    from pgpoll.typed.rows import ColumnLedger, TypedLayout

    schema: TableSchema = work.table.table_schema
    physical = {name: phys for phys, name, _t in TypedLayout.build([schema], ColumnLedger()).columns}
    key_columns = [physical[k] for k in work.table.key if k in physical]
    own = source is None
    source = source or ChunkSource(work.dsn, work.fetch)
    counted = [0]

    def typed(stream: ChunkStream) -> Iterator[pa.Table]:
        for batch in stream.batches:
            values = pa.Table.from_batches([batch])
            if work.row_filters:
                values = filter_rows(values, schema, work.row_filters)
            table = typed_chunk(values, schema, stream.native)
            counted[0] += table.num_rows
            yield table

    try:
        with _open(work, source) as stream:
            held = time.monotonic()
            empty = typed_chunk(pa.schema([pa.field(n, pa.string()) for n in work.table.names]).empty_table(), schema)
            write_batches(path, typed(stream), empty, fs, key_columns)
            held = time.monotonic() - held
    finally:
        if own:
            source.close()
    return stream, counted[0], held


def run_chunk(work: ChunkWork, source: ChunkSource | None = None) -> ChunkResult:
    """Read, type, write and publish one chunk."""
    from pgpoll.sink.snapshot_store import SnapshotStore, manifest_name, now_iso
    from pgpoll.sink.stores.filesystem import open_output

    store = SnapshotStore(work.fs if work.fs is not None else open_output(work.output), work.snapshot_id)
    n = int(work.chunk.n)
    if store.fs.exists(store.meta(work.table_dir, manifest_name(n))):
        return ChunkResult(work.table_dir, n)  # a retried task after its chunk was published
    attempt_name, attempt_path = store.attempt(work.table_dir, n)
    store.fs.mkdirs(attempt_path.rsplit("/", 1)[0])
    if work.pause_dir is not None:
        _pause(work.pause_dir, f"{work.table_dir}.{n}")
    try:
        read, rows, held = write_chunk(work, attempt_path, source, store.fs)
    except BaseException:
        with contextlib.suppress(Exception):
            store.fs.delete(attempt_path)
        raise
    size = int(store.fs.arrow().get_file_info(store.fs.arrow_path(attempt_path)).size or 0)
    if work.plan_relfilenode is not None and read.relfilenode != work.plan_relfilenode:
        log.info("chunk %d of %s: the table was rewritten since the plan (filenode %d, planned %d)",
                 n, work.table_dir, read.relfilenode, work.plan_relfilenode)
    manifest = {
        "snapshot": read.snapshot.to_json(), "relfilenode": int(read.relfilenode), "rows": rows,
        "bytes": int(size), "read_at": now_iso(), "held_s": round(held, 3),
    }
    if work.recheck_since is not None:
        manifest["recheck_since"] = int(work.recheck_since)
    won = store.publish(work.table_dir, n, attempt_name, manifest)
    return ChunkResult(work.table_dir, n, rows, int(size), won, tuple(read.snapshot.xip), held)


def _pause(directory: str, name: str) -> None:
    """Tests only (see :data:`PAUSE_ENV`)."""
    with open(os.path.join(directory, name + ".ready"), "w"):
        pass
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(os.path.join(directory, name + ".go")) and time.monotonic() < deadline:
        time.sleep(0.02)


def run_chunks(works: Iterable[ChunkWork]) -> Iterator[ChunkResult]:
    """A Spark partition: its chunks one after the other, on one connection (one transaction each)."""
    source: ChunkSource | None = None
    try:
        for work in works:
            try:
                source = source or ChunkSource(work.dsn, work.fetch)
                yield run_chunk(work, source)
            except PgpollError as exc:
                yield ChunkResult(work.table_dir, int(work.chunk.n), error=exc)
                return  # the run stops; the partition's other chunks stay for the next run
    finally:
        if source is not None:
            source.close()
