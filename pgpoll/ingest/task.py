"""The batch task's reading: peek, decode, assemble the change envelope as Arrow record batches.

Runs on an executor (or in the driver, for a batch there): it opens its own
connection, streams the peek (ADBC into Arrow, or a psycopg2 server-side
cursor: :mod:`pgpoll.ingest.peek_chunks`), decodes it — runs of INSERTs
column-wise, the rest row by row — groups rows into committed transactions
and produces the change envelope as Arrow record batches — no row passes
through the driver. :mod:`pgpoll.ingest.batch_writes` writes them (pyarrow's
Parquet writer in the task, or Spark's behind ``mapInArrow``).

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
from typing import Any

import pyarrow as pa

from pgpoll import faults
from pgpoll.changes import Begin, Commit, Ignored, LogicalMessage, Op, RowChange, Truncate
from pgpoll.decode.decoders import make_decoder
from pgpoll.errors import DecodeError, PgpollError
from pgpoll.ingest.batch_assembler import BatchAssembler
from pgpoll.ingest.progress_channel import ChannelAddress, ProgressReporter
from pgpoll.lsn import Lsn
from pgpoll.sink.parquet_writer import StagingTarget
from pgpoll.sink.stores.uploads import UploadedBatch
from pgpoll.source.arrow_peek import PSYCOPG2
from pgpoll.table_patterns import TablePatterns


@dataclass(frozen=True)
class BatchSpec:
    """Everything a batch task needs; pickled to the executor."""

    dsn: str
    slot: str
    plugin: str
    options: tuple[str, ...]
    upto_nchanges: int | None
    high_water_mark: int | None
    #: the peek's upto_lsn: decode no further than the WAL record ending there (the batch's WAL budget,
    #: pgpoll.ingest.batch_bounds; a Spark stream's batch end)
    upto_lsn: int | None = None
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
    #: --decode-parallelism, and the LSNs the driver cut the batch's range at for it (pgpoll.ingest.decode_ranges):
    #: the slot is peeked up to splits[0], temporary copies of it decode from each split on, at the same time
    decode_parallelism: int = 1
    splits: tuple[int, ...] = ()

    def __repr__(self) -> str:  # never show the DSN (it may carry a password)
        return (f"BatchSpec(slot={self.slot!r}, plugin={self.plugin!r}, upto_lsn={self.upto_lsn}, "
                f"upto_nchanges={self.upto_nchanges})")


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
    from pgpoll.ingest.decode_ranges import ranged_chunks
    from pgpoll.ingest.peek_chunks import Chunk, peek_chunks
    from pgpoll.source.arrow_peek import ADBC, choose_fetch
    from pgpoll.source.catalog import catalog_table
    from pgpoll.source.connection import ConnectionTarget, connect
    from pgpoll.source.waits import CallWatch

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
        def peek(upto_lsn: int | None) -> Iterator[Chunk]:
            return peek_chunks(
                conn, spec.dsn, spec.slot, spec.plugin, fetch=outcome.fetch or PSYCOPG2, upto_lsn=upto_lsn,
                upto_nchanges=spec.upto_nchanges,
                options=list(spec.options), rows_per_fetch=CHUNK_ROWS,
                on_xid_reference=asm.set_xid_reference,  # the assembler widens each committed 32-bit xid with it
                on_fallback=lambda why: _fell_back(outcome, why),
                watch=CallWatch(ConnectionTarget(spec.dsn, "task"), f'the peek of slot "{spec.slot}"',
                                lambda text: _waiting(reporter, text, outcome.peeked_rows, asm.changes)),
            )

        # the range cut for temporary copies of the slot (read through ADBC), else the slot alone
        chunks = ranged_chunks(peek, spec, asm) if spec.splits and outcome.fetch == ADBC else peek(spec.upto_lsn)

        text_run = decode.text_run if spec.column_inserts else None

        def one_by_one(chunk: Chunk, lo: int, hi: int) -> Generator[pa.RecordBatch, None, bool]:
            """Decode rows ``lo..hi`` of ``chunk`` one by one; False when a row is rejected (the batch stops there).

            After a test_decoding INSERT, the INSERT lines right after it that
            start alike go column-wise (:mod:`pgpoll.decode.text_columns`).
            """
            row = lo
            while row < hi:
                lsn, xid, data = int(chunk.lsns[row]), chunk.xid_of(row), chunk.value(row)
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


def _waiting(reporter: ProgressReporter, text: str, rows: int, changes: int) -> None:
    """A wait of the peek (:mod:`pgpoll.source.waits`): to the driver's stderr, or this process's log without it."""
    reporter.report("server", rows, changes, note=text, force=True)
    if not reporter.connected:
        import logging

        logging.getLogger("pgpoll.ingest").warning("%s", text)


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
