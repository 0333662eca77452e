"""The Spark task of one batch: peek, decode, assemble, write Parquet (or yield Arrow to Spark's writer).

Runs on an executor: it opens its own connection, streams the peek (ADBC into
Arrow, or a psycopg2 server-side cursor: :mod:`pgpoll.ingest.peek_chunks`),
decodes it — runs of INSERTs column-wise, the rest row by row — groups rows into committed transactions
and produces the change envelope as Arrow record batches — no row passes
through the driver. Two ways to write them:

* :func:`pyarrow_task` (the output is a local path or ``file:`` URI): the task
  writes the staged Parquet files itself with pyarrow
  (:mod:`pgpoll.sink.parquet_writer`), and with ``--typed-tables`` every
  table's typed rows in the same pass; it runs as a one-partition RDD job
  whose ``collect()`` returns the :class:`BatchOutcome`;
* :func:`spark_task` (any other store): the function given to ``mapInArrow``,
  yielding the batches to Spark's Parquet writer; the outcome travels in a
  Spark accumulator.

The outcome is what the driver needs back: the LSN to advance to, counts,
the lowest and highest full transaction id, an error or a rejected row, and
the files written. The envelope's ``xid`` is the full 64-bit id: the peek
reads a reference id after building its result, and the batch assembler
widens each committed transaction's 32-bit id with it.

Nothing here moves the slot: a peek is repeatable until the driver advances,
so a retried task or batch is safe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgpoll.changes import Begin, Commit, Ignored, LogicalMessage, Op, RowChange, Truncate
from pgpoll.decode.decoders import make_decoder
from pgpoll.errors import DecodeError, PgpollError, SinkError
from pgpoll.ingest import faults
from pgpoll.ingest.batch_assembler import BatchAssembler
from pgpoll.ingest.progress_channel import ChannelAddress, ProgressReporter
from pgpoll.lsn import Lsn
from pgpoll.sink.parquet_writer import (
    ENVELOPE_DICTIONARY,
    PYARROW,
    SPARK,
    PartFiles,
    StagingTarget,
    WriterThread,
    clear_directory,
)
from pgpoll.sink.uploads import UploadedBatch
from pgpoll.source.arrow_peek import PSYCOPG2
from pgpoll.table_patterns import TablePatterns

if TYPE_CHECKING:
    from pgpoll.sink.typed_tables import TypedTableWriters


@dataclass(frozen=True)
class BatchSpec:
    """Everything a batch task needs; pickled to the executor."""

    dsn: str
    slot: str
    plugin: str
    options: tuple[str, ...]
    upto_nchanges: int | None
    high_water_mark: int | None
    tables: TablePatterns = field(default_factory=TablePatterns)
    proto_version: int = 1
    rows_per_arrow_batch: int = 65536
    fault: str | None = None
    row_filters: tuple[str, ...] = ()  # --row-filter specs (test_decoding), parsed again on the executor
    progress: ChannelAddress | None = None  # where to send progress lines (pgpoll.ingest.progress_channel)
    batch_number: int = 0
    fetch: str = "auto"  # PGPOLL_FETCH as the driver read it (pgpoll.source.arrow_peek.requested_fetch)
    #: False: every row through the row path (what the tests compare the column-wise Insert path with)
    column_inserts: bool = True
    typed_tables: bool = False  # with the pyarrow writer: write every table's typed rows in the same pass
    target: StagingTarget | None = None  # where the pyarrow writer stages the batch (set by the driver)
    #: the peek's upto_lsn: decode no further than the WAL record ending there (a Spark stream's batch end)
    upto_lsn: int | None = None

    def __repr__(self) -> str:  # never show the DSN (it may carry a password)
        return f"BatchSpec(slot={self.slot!r}, plugin={self.plugin!r}, upto_nchanges={self.upto_nchanges})"


@dataclass
class BatchOutcome:
    """What one batch task reports to the driver."""

    peeked_rows: int = 0
    column_rows: int = 0  # of those, rows decoded column-wise (runs of INSERTs)
    changes: int = 0
    advance_to: int | None = None
    first_commit_lsn: int | None = None
    last_commit_lsn: int | None = None
    first_commit_ts: str | None = None
    last_commit_ts: str | None = None
    xid_min: int | None = None  # full 64-bit ids of the transactions the batch covers (None: none)
    xid_max: int | None = None
    open_transaction_at_end: bool = False
    error: PgpollError | None = None
    reject: dict[str, Any] | None = None
    schemas: dict[str, str] = field(default_factory=dict)  # schema id -> TableSchema JSON
    extra: dict[str, Any] = field(default_factory=dict)
    writer: str | None = None  # "pyarrow" or "spark"
    fetch: str | None = None  # "adbc" or "psycopg2"
    #: pyarrow writer with typed tables: {table dir: {file: size}} written in the task (None: not written yet)
    typed_files: dict[str, dict[str, int]] | None = None
    ledgers: dict[str, dict[str, Any]] = field(default_factory=dict)  # table dir -> changed column ledger
    uploaded: UploadedBatch | None = None  # an object store's batch: the files put at their final keys


#: Peeked rows decoded together: runs of Inserts within a chunk are decoded column-wise.
CHUNK_ROWS = 8192


def _reject(lsn: int, xid: int | None, data: Any, error: DecodeError, row_number: int) -> dict[str, Any]:
    row: dict[str, Any] = {"lsn": str(Lsn(lsn)), "xid": xid, "row": row_number, "error": str(error)}
    if isinstance(data, (bytes, bytearray, memoryview)):
        row["data_hex"] = bytes(data).hex()
    else:
        row["data"] = data
    return row


def iter_batch(
    spec: BatchSpec, outcome: BatchOutcome, on_assembler: Callable[[BatchAssembler], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """Peek, decode and assemble one batch, yielding Arrow record batches; fills ``outcome``.

    Errors are recorded in ``outcome.error`` (and a bad row in
    ``outcome.reject``) instead of raised, so the driver can report them with
    their own exit code. ``on_assembler`` gets the batch assembler before the
    peek (its ``schemas`` registry grows as rows are decoded). ``stopped``
    (a batch in the driver: SIGINT/SIGTERM was received) is asked before each
    fetch; when it says so the batch ends there, unfinished, and the caller
    discards it.
    """
    from pgpoll.ingest.peek_chunks import Chunk, peek_chunks
    from pgpoll.source.arrow_peek import choose_fetch
    from pgpoll.source.catalog import catalog_table
    from pgpoll.source.connection import ConnectionTarget, connect

    conn = None
    decode = make_decoder(spec.plugin, spec.proto_version)
    row_filters = None
    if spec.row_filters:
        from pgpoll.rowfilter.evaluate import TableFilters
        from pgpoll.rowfilter.expression import parse_row_filter

        row_filters = TableFilters([parse_row_filter(s) for s in spec.row_filters])
    asm = BatchAssembler(
        high_water_mark=spec.high_water_mark, accepts=spec.tables.accepts,
        rows_per_batch=spec.rows_per_arrow_batch, type_names=getattr(decode, "type_names", None),
        catalog=lambda schema, table: catalog_table(conn, schema, table), row_filters=row_filters,
    )
    reporter = ProgressReporter(spec.progress, spec.batch_number)
    if on_assembler is not None:
        on_assembler(asm)
    try:
        conn = connect(ConnectionTarget(spec.dsn, "task"), application_name=f"pgpoll ingest {spec.slot}")
        fast_row, insert_run = decode.fast_row, decode.insert_run if spec.column_inserts else None
        outcome.fetch = choose_fetch(spec.plugin, spec.fetch)
        chunks = peek_chunks(
            conn, spec.dsn, spec.slot, spec.plugin, fetch=outcome.fetch, upto_nchanges=spec.upto_nchanges,
            upto_lsn=spec.upto_lsn,
            options=list(spec.options), rows_per_fetch=CHUNK_ROWS,
            on_xid_reference=asm.set_xid_reference,  # the assembler widens each committed 32-bit xid with it
            on_fallback=lambda why: _fell_back(outcome, why),
        )

        text_run = decode.text_run if spec.column_inserts else None

        def one_by_one(chunk: Chunk, lo: int, hi: int) -> Generator[pa.RecordBatch, None, bool]:
            """Decode rows ``lo..hi`` of ``chunk`` one by one; False when a row is rejected (the batch stops there).

            After a test_decoding INSERT, the INSERT lines right after it that
            start alike go column-wise (:mod:`pgpoll.decode.text_columns`).
            """
            row = lo
            while row < hi:
                lsn, xid, data = chunk.lsns[row], chunk.xids[row], chunk.value(row)
                outcome.peeked_rows += 1
                try:
                    fields = fast_row(data) if fast_row is not None else None
                    if fields is not None:
                        yield from asm.row_fields(fields, lsn)
                        row += 1
                        continue
                    event = decode(data, lsn, xid)
                    yield from _dispatch(asm, event, lsn)
                except DecodeError as exc:
                    outcome.error = exc
                    outcome.reject = _reject(lsn, xid, data, exc, outcome.peeked_rows)
                    return False
                row += 1
                if (text_run is not None and chunk.columns is not None and type(event) is RowChange
                        and event.op is Op.INSERT and event.after and not event.unchanged_toast
                        and asm.takes_rows_like(event)):
                    run = text_run(chunk.columns, row - 1, hi)
                    if run is not None:  # rows row..end at once
                        end, after = run
                        outcome.peeked_rows += end - row
                        outcome.column_rows += end - row
                        yield from asm.insert_rows_like(event, chunk.lsns[row:end], after)
                        row = end
            return True

        def batches() -> Iterator[pa.RecordBatch]:
            reporter.report("server", force=True)  # the server builds the whole result before the first row
            for chunk in chunks:
                if stopped is not None and stopped():
                    outcome.error = PgpollError("the batch was interrupted", "run again: it starts where this one did")
                    return
                if not outcome.peeked_rows:
                    faults.crash_if("after-peek", spec.fault)
                columns = chunk.columns if insert_run is not None else None
                runs = columns.insert_runs() if columns is not None else []
                done = 0
                for lo, hi, relid in [*runs, (len(chunk), len(chunk), -1)]:
                    if not (yield from one_by_one(chunk, done, lo)):
                        return
                    decoded = insert_run(columns, lo, hi, relid) if columns is not None and insert_run and lo < hi else None
                    if decoded is not None:  # the whole run at once (pgpoll.decode.pgoutput_columns)
                        outcome.peeked_rows += hi - lo
                        outcome.column_rows += hi - lo
                        yield from asm.insert_block(decoded[0], chunk.lsns[lo:hi], decoded[1])
                    elif not (yield from one_by_one(chunk, lo, hi)):
                        return
                    done = hi
                reporter.report("fetch", outcome.peeked_rows, asm.changes)
            outcome.open_transaction_at_end = asm.in_transaction
            yield from asm.finish()

        for number, batch in enumerate(batches()):
            yield batch
            if number == 0:
                faults.crash_if("mid-write", spec.fault)
    except PgpollError as exc:
        outcome.error = exc
    except Exception as exc:  # reported to the driver, which decides the exit code
        outcome.error = PgpollError(f"batch task failed: {type(exc).__name__}: {exc}", "run again with PGPOLL_DEBUG=1")
    finally:
        outcome.changes = asm.changes
        outcome.advance_to = asm.advance_to
        outcome.first_commit_lsn = asm.first_commit_lsn
        outcome.last_commit_lsn = asm.last_commit_lsn
        outcome.last_commit_ts = asm.last_commit_ts.isoformat() if asm.last_commit_ts else None
        outcome.first_commit_ts = asm.first_commit_ts.isoformat() if asm.first_commit_ts else None
        outcome.xid_min, outcome.xid_max = asm.xid_min, asm.xid_max
        outcome.schemas = {sid: described.to_json() for sid, described in asm.schemas.items()}
        reporter.report("fetch", outcome.peeked_rows, asm.changes, force=True)
        reporter.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _fell_back(outcome: BatchOutcome, why: str) -> None:
    import logging

    logging.getLogger(__name__).info("the ADBC peek failed before its first row (%s): reading it with psycopg2", why)
    outcome.fetch = PSYCOPG2


def _dispatch(asm: BatchAssembler, event: Any, lsn: int) -> Iterator[pa.RecordBatch]:
    """Route one decoded event to the batch assembler."""
    if isinstance(event, RowChange):
        return asm.row_change(event, lsn)
    if isinstance(event, Begin):
        asm.begin(event.xid, event.commit_ts)
        return iter(())
    if isinstance(event, Commit):
        return asm.commit(lsn, event.xid, event.commit_ts)
    if isinstance(event, LogicalMessage):
        return asm.message(event, lsn)
    if isinstance(event, Truncate):
        return asm.truncate(event, lsn)
    if isinstance(event, Ignored):
        return iter(())
    raise DecodeError(
        f"{type(event).__name__} at {Lsn(lsn)}: pgpoll ingest reads whole transactions only",
        "do not create the slot with two-phase decoding, and do not peek with streaming",
        lsn=str(Lsn(lsn)),
    )


def _peak_rss_kb() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _ignore_sigint() -> None:
    """Leave Ctrl-C to the driver: a terminal sends SIGINT to the whole process group, Spark's
    Python workers included, and PySpark's worker turns it into a KeyboardInterrupt traceback.
    The driver cancels the job itself (see :mod:`pgpoll.ingest.stopping`)."""
    import signal

    with contextlib.suppress(ValueError):  # not the worker's main thread: nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def spark_task(spec: BatchSpec, accumulator: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function given to ``mapInArrow``: runs :func:`iter_batch` and reports through ``accumulator``."""

    def run(_input: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _ignore_sigint()
        for _ in _input:
            pass
        outcome = BatchOutcome(writer=SPARK)
        try:
            yield from iter_batch(spec, outcome)
        finally:
            outcome.extra["task_peak_rss_kb"] = _peak_rss_kb()
            accumulator.add({"outcome": outcome})

    return run


def _write_typed(writers: TypedTableWriters, batches: list[pa.RecordBatch]) -> None:
    """The typed rows of a few envelope record batches, combined first (on the typed thread: the copy is work)."""
    for part in pa.Table.from_batches(batches).combine_chunks().to_batches():
        writers.write(part)


def write_batch(spec: BatchSpec, outcome: BatchOutcome, stopped: Callable[[], bool] | None = None) -> None:
    """Run :func:`iter_batch` and write its record batches to ``spec.target`` with pyarrow; fills ``outcome``.

    A local output's batch is written into its staging directory; an object
    store's into a spill directory of this process, then uploaded to its
    final keys under the plan's upload manifest (:mod:`pgpoll.sink.uploads`;
    ``outcome.uploaded`` lists the files). A write error is reported in
    ``outcome.error``; the driver discards the staging (and uploads).
    """
    target = spec.target
    assert target is not None
    if target.upload is None:
        assert target.envelope is not None
        _write_files(spec, outcome, target.envelope, target.tables if spec.typed_tables else None, stopped)
        return
    import shutil
    import tempfile

    from pgpoll.sink import layout
    from pgpoll.sink.uploads import upload_batch

    spill = tempfile.mkdtemp(prefix="pgpoll-batch-")
    try:
        envelope_dir, tables_dir = f"{spill}/envelope", f"{spill}/tables" if spec.typed_tables else None
        _write_files(spec, outcome, envelope_dir, tables_dir, stopped)
        if outcome.error is None and outcome.changes and outcome.advance_to is not None and target.fs is not None:
            start = outcome.first_commit_lsn if outcome.first_commit_lsn is not None else outcome.advance_to
            try:
                outcome.uploaded = upload_batch(target.fs, target.upload, envelope_dir, tables_dir,
                                                layout.partition_name(start, outcome.advance_to))
            except PgpollError as exc:
                outcome.error = exc
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _write_files(spec: BatchSpec, outcome: BatchOutcome, envelope_dir: str, typed_dir: str | None,
                 stopped: Callable[[], bool] | None) -> None:
    """Write the batch into local directories: the envelope into ``envelope_dir`` as it is produced (one row
    group per record batch, written on a :class:`WriterThread` that overlaps with decoding; at most a few
    batches in memory), each table's typed rows under ``typed_dir`` in the same pass, on a second thread."""
    from pgpoll.sink.typed_tables import TypedTableWriters

    target = spec.target
    assert target is not None
    holder: list[TypedTableWriters] = []

    def ready(asm: BatchAssembler) -> None:
        if typed_dir is not None:
            holder.append(TypedTableWriters(typed_dir, target.ledgers, asm.schemas, target.fs))

    clear_directory(envelope_dir)  # an earlier attempt of this task (the driver clears before each batch)
    if typed_dir is not None:
        clear_directory(typed_dir)
    envelope = PartFiles(envelope_dir, dictionary=ENVELOPE_DICTIONARY)
    writes = WriterThread()
    typed_writes = WriterThread() if typed_dir is not None else None  # its own thread: both overlap decoding

    pending: list[pa.RecordBatch] = []  # the typed conversion's fixed cost is per call: give it bigger batches

    def typed(final: bool = False) -> None:
        if typed_writes is None or not holder or not pending:
            return
        if final or sum(b.num_rows for b in pending) >= spec.rows_per_arrow_batch:
            taken = list(pending)
            pending.clear()
            typed_writes.submit(lambda: _write_typed(holder[0], taken))

    batches = iter_batch(spec, outcome, on_assembler=ready, stopped=stopped)
    try:
        for batch in batches:
            if batch.num_rows:
                writes.submit(lambda b=batch: envelope.write(b))  # type: ignore[misc]
                pending.append(batch)
                typed()
        typed(final=True)
        writes.finish()
        if typed_writes is not None:
            typed_writes.finish()
        envelope.close()
        if holder:
            outcome.typed_files, outcome.ledgers = holder[0].close()
        elif typed_dir is not None:
            outcome.typed_files = {}
    except Exception as exc:  # reported to the driver, which discards the staging
        for thread in (writes, typed_writes):
            if thread is not None:
                with contextlib.suppress(Exception):
                    thread.finish()
        envelope.abort()
        if holder:
            holder[0].abort()
        if outcome.error is None:
            outcome.error = SinkError(
                f"writing the batch failed: {type(exc).__name__}: {exc}", "check that the output is writable"
            )
    finally:
        batches.close()


def write_batch_here(spec: BatchSpec, stopped: Callable[[], bool] | None = None) -> BatchOutcome:
    """:func:`write_batch` in this process (an executor's task, or the driver); the outcome."""
    outcome = BatchOutcome(writer=PYARROW)
    try:
        write_batch(spec, outcome, stopped)
    finally:
        outcome.extra["task_peak_rss_kb"] = _peak_rss_kb()
    return outcome


def pyarrow_task(spec: BatchSpec) -> Callable[[Iterator[Any]], Iterator[BatchOutcome]]:
    """The function of the batch's one-partition RDD job: :func:`write_batch_here`, then yield the outcome."""

    def run(_input: Iterator[Any]) -> Iterator[BatchOutcome]:
        _ignore_sigint()
        for _ in _input:
            pass
        yield write_batch_here(spec)

    return run
