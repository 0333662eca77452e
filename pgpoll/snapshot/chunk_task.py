"""One chunk of a snapshot, inside a Spark task: read it, type it as the typed tables do, write it, publish it.

The task reads the chunk in its own short transaction
(:func:`pgpoll.source.snapshot_reads.read_chunk`: the server's text of every
value, as the change stream prints it), converts each column exactly as the
typed tables do (:func:`pgpoll.sink.typed_columns.column_to_arrow`, under
the physical names a fresh :class:`~pgpoll.typed.rows.ColumnLedger` gives
this one table shape; what a typed column cannot hold keeps its exact text in
``_untyped``), writes one Parquet file with pyarrow as an *attempt*, and
publishes it through :class:`~pgpoll.sink.snapshot_store.SnapshotStore`
(manifest created exclusively, then the final name). A retried or
speculative task that loses the manifest race deletes its attempt: harmless.

pgpoll's own errors come back in the result (they pickle with their class,
so a lock timeout still exits 4 on the driver); anything else fails the task.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgpoll.errors import PgpollError
from pgpoll.sink import layout
from pgpoll.typed.schemas import TableSchema

if TYPE_CHECKING:
    from pgpoll.sink.output_fs import OutputFs
    from pgpoll.source.snapshot_catalog import SnapshotTable
    from pgpoll.source.snapshot_reads import ChunkSpec, ChunkStream

log = logging.getLogger("pgpoll.snapshot")

_UNTYPED = pa.map_(pa.string(), pa.string())
LOCK_ATTEMPTS = 4  # reads of a chunk whose LOCK TABLE timed out, before the run stops (exit 4)
LOCK_BACKOFF_S = 1.0  # doubled after each timed-out attempt


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
    error: PgpollError | None = field(default=None, compare=False)


def typed_chunk(texts: pa.Table, schema: TableSchema) -> pa.Table:
    """A chunk's text columns -> its typed columns + ``_untyped`` + ``_schema_id`` (the typed tables' conversion)."""
    from pgpoll.sink.typed_columns import column_to_arrow
    from pgpoll.typed.rows import ColumnLedger, TypedLayout

    typed_layout = TypedLayout.build([schema], ColumnLedger())
    n = texts.num_rows
    arrays: list[pa.Array[Any]] = []
    fields: list[pa.Field[Any]] = []
    untyped: dict[int, list[tuple[str, str]]] = {}
    own = typed_layout.arrow_schema()
    for i, (phys, name, t) in enumerate(typed_layout.columns):
        column: Any = texts.column(name)
        text_array: pa.Array[Any] = (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
        if text_array.type != pa.string():
            text_array = text_array.cast(pa.string())
        array, fallback = column_to_arrow(t, text_array)
        for row in fallback:
            text = text_array[row].as_py()
            if text is not None:
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


@contextlib.contextmanager
def _open(work: ChunkWork) -> Iterator[ChunkStream]:
    """``stream_chunk`` with bounded retries of a lock timeout (then its error: exit 4, naming the blocker)."""
    from pgpoll.errors import LockTimeoutError
    from pgpoll.source.snapshot_reads import stream_chunk

    wait = LOCK_BACKOFF_S
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        with contextlib.ExitStack() as stack:
            try:  # the lock and the snapshot are taken on entering
                stream = stack.enter_context(stream_chunk(
                    work.dsn, work.table, work.chunk, lock_timeout_ms=work.lock_timeout_ms,
                    exported=work.exported, exported_relfilenode=work.exported_relfilenode))
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


def write_chunk(work: ChunkWork, path: str, fs: Any = None) -> tuple[ChunkStream, int]:
    """Read the chunk into one Parquet file at ``path`` (of ``fs``, the output; None: a local path), batch by batch;
    returns the stream and the row count. On an object store the file is one upload, whole when closed."""
    import pyarrow.parquet as pq

    where: dict[str, Any] = {} if fs is None else {"filesystem": fs.arrow()}
    target = path if fs is None else fs.arrow_path(path)
    schema: TableSchema = work.table.table_schema
    rows = 0
    writer: Any = None
    with _open(work) as stream:
        try:
            for batch in stream.batches:
                texts = pa.Table.from_batches([batch])
                if work.row_filters:
                    texts = filter_rows(texts, schema, work.row_filters)
                typed = typed_chunk(texts, schema)
                if writer is None:  # (dictionary encoding's buffers grew with the chunk's rows: measured)
                    writer = pq.ParquetWriter(target, typed.schema, use_dictionary=False, **where)
                writer.write_table(typed.cast(writer.schema))
                rows += typed.num_rows
            if writer is None:  # no rows: an empty file with the columns
                empty = typed_chunk(pa.schema([pa.field(n, pa.string()) for n in work.table.names]).empty_table(), schema)
                writer = pq.ParquetWriter(target, empty.schema, **where)
                writer.write_table(empty)
        finally:
            if writer is not None:
                writer.close()
    return stream, rows


def run_chunk(work: ChunkWork) -> ChunkResult:
    """Read, type, write and publish one chunk."""
    from pgpoll.sink.filesystem import open_output
    from pgpoll.sink.snapshot_store import SnapshotStore, manifest_name, now_iso

    store = SnapshotStore(work.fs if work.fs is not None else open_output(work.output), work.snapshot_id)
    n = int(work.chunk.n)
    if store.fs.exists(store.meta(work.table_dir, manifest_name(n))):
        return ChunkResult(work.table_dir, n)  # a retried task after its chunk was published
    attempt_name, attempt_path = store.attempt(work.table_dir, n)
    store.fs.mkdirs(attempt_path.rsplit("/", 1)[0])
    try:
        read, rows = write_chunk(work, attempt_path, store.fs)
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
        "bytes": int(size), "read_at": now_iso(),
    }
    won = store.publish(work.table_dir, n, attempt_name, manifest)
    return ChunkResult(work.table_dir, n, rows, int(size), won, tuple(read.snapshot.xip))


def run_chunks(works: Iterable[ChunkWork]) -> Iterator[ChunkResult]:
    """A Spark partition: its chunks one after the other (one connection at a time per task)."""
    for work in works:
        try:
            yield run_chunk(work)
        except PgpollError as exc:
            yield ChunkResult(work.table_dir, int(work.chunk.n), error=exc)
            return  # the run stops; the partition's other chunks stay for the next run
