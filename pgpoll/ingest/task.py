"""The Spark task of one batch: peek, decode, assemble, yield Arrow record batches.

Runs on an executor inside ``mapInArrow``: it opens its own connection,
streams the peek through a server-side cursor, decodes each row, groups rows
into committed transactions and yields the change envelope as Arrow record
batches straight to Spark's Parquet writer — no row passes through the
driver. What the driver needs back (the LSN to advance to, counts, an error
or a rejected row) travels in a Spark accumulator as a :class:`BatchOutcome`.

Nothing here moves the slot: a peek is repeatable until the driver advances,
so a retried task or batch is safe.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import pyarrow as pa

from pgpoll.changes import Commit, CommitPrepared, LogicalMessage, Op, RollbackPrepared
from pgpoll.errors import DecodeError, PgpollError
from pgpoll.ingest import faults
from pgpoll.ingest.spill import SpillBuffer
from pgpoll.lsn import Lsn
from pgpoll.sink.envelope import EnvelopeBuilder

HEARTBEAT_PREFIX = "pgpoll.heartbeat"


@dataclass(frozen=True)
class TableFilter:
    """``--tables`` / ``--exclude-tables``: shell patterns over ``schema.table``."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def accepts(self, schema: Optional[str], table: Optional[str]) -> bool:
        """True when changes of ``schema.table`` belong in the output."""
        if table is None:
            return True
        name = f"{schema}.{table}"
        if self.include and not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(table, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(table, p) for p in self.exclude)


@dataclass(frozen=True)
class BatchSpec:
    """Everything a batch task needs; pickled to the executor."""

    dsn: str
    slot: str
    plugin: str
    options: tuple[str, ...]
    upto_nchanges: Optional[int]
    high_water_mark: Optional[int]
    table_filter: TableFilter = TableFilter()
    proto_version: int = 1
    rows_per_arrow_batch: int = 65536
    spill_after: int = 20_000
    fault: Optional[str] = None

    def __repr__(self) -> str:  # never show the DSN (it may carry a password)
        return f"BatchSpec(slot={self.slot!r}, plugin={self.plugin!r}, upto_nchanges={self.upto_nchanges})"


@dataclass
class BatchOutcome:
    """What one batch task reports to the driver."""

    peeked_rows: int = 0
    changes: int = 0
    advance_to: Optional[int] = None
    first_commit_lsn: Optional[int] = None
    last_commit_lsn: Optional[int] = None
    last_commit_ts: Optional[str] = None
    open_transaction_at_end: bool = False
    error: Optional[PgpollError] = None
    reject: Optional[dict[str, Any]] = None
    extra: dict[str, Any] = field(default_factory=dict)


def make_decoder(plugin: str, proto_version: int) -> Callable[[Any, Optional[Lsn], Optional[int]], Any]:
    """A function ``(data, lsn, xid) -> Event`` for the plugin."""
    if plugin == "pgoutput":
        from pgpoll.decode.pgoutput import PgoutputDecoder

        pg = PgoutputDecoder(proto_version)
        return lambda data, lsn, xid: pg.decode(data, lsn)
    from pgpoll.decode.test_decoding import TestDecodingDecoder

    td = TestDecodingDecoder()

    def decode_text(data: bytes, lsn: Optional[Lsn], xid: Optional[int]) -> Any:
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(
                f"test_decoding row at {lsn} is not valid UTF-8 (byte {exc.start})",
                "the row is saved under _pgpoll/rejects/; once understood, skip it with: pgpoll slot advance SLOT <next COMMIT lsn>",
                offset=exc.start,
                lsn=str(lsn) if lsn is not None else None,
            ) from None
        return td.decode(line, lsn=lsn, xid=xid)

    return decode_text


def _reject(lsn: Lsn, xid: Optional[int], data: Any, error: DecodeError, row_number: int) -> dict[str, Any]:
    row: dict[str, Any] = {"lsn": str(lsn), "xid": xid, "row": row_number, "error": str(error)}
    if isinstance(data, (bytes, bytearray, memoryview)):
        row["data_hex"] = bytes(data).hex()
    else:
        row["data"] = data
    return row


def iter_batch(spec: BatchSpec, outcome: BatchOutcome) -> Iterator[pa.RecordBatch]:
    """Peek, decode and assemble one batch, yielding Arrow record batches; fills ``outcome``.

    Errors are recorded in ``outcome.error`` (and a bad row in
    ``outcome.reject``) instead of raised, so the driver can report them with
    their own exit code.
    """
    from pgpoll.decode.assembler import TransactionAssembler
    from pgpoll.source.connection import ConnectionTarget, connect
    from pgpoll.source.slots import peek_rows

    conn = None
    try:
        conn = connect(ConnectionTarget(spec.dsn, "task"), application_name=f"pgpoll ingest {spec.slot}")
        decode = make_decoder(spec.plugin, spec.proto_version)
        assembler = TransactionAssembler(buffer_factory=lambda: SpillBuffer(spec.spill_after))
        builder = EnvelopeBuilder()
        hwm = spec.high_water_mark
        yielded = False
        rows = peek_rows(
            conn, spec.slot, spec.plugin, upto_nchanges=spec.upto_nchanges, options=list(spec.options), raw_text=True
        )
        for lsn, xid, data in rows:
            outcome.peeked_rows += 1
            if outcome.peeked_rows == 1:
                faults.crash_if("after-peek", spec.fault)
            try:
                event = decode(data, lsn, xid)
            except DecodeError as exc:
                outcome.error = exc
                outcome.reject = _reject(lsn, xid, data, exc, outcome.peeked_rows)
                return
            if isinstance(event, (Commit, CommitPrepared, RollbackPrepared)):
                outcome.advance_to = int(lsn)
            elif isinstance(event, LogicalMessage) and not event.transactional:
                outcome.advance_to = int(lsn)
            for record in assembler.feed_iter(event):
                if record.commit_lsn is not None and hwm is not None and record.commit_lsn <= hwm:
                    continue  # already in the output (the slot was behind the commit log)
                if record.op == Op.MESSAGE and record.message_prefix == HEARTBEAT_PREFIX:
                    continue
                if not spec.table_filter.accepts(record.schema_name, record.table_name):
                    continue
                builder.append(record)
                outcome.changes += 1
                if record.commit_lsn is not None:
                    if outcome.first_commit_lsn is None or record.commit_lsn < outcome.first_commit_lsn:
                        outcome.first_commit_lsn = record.commit_lsn
                    if outcome.last_commit_lsn is None or record.commit_lsn > outcome.last_commit_lsn:
                        outcome.last_commit_lsn = record.commit_lsn
                        if record.commit_ts is not None:
                            outcome.last_commit_ts = record.commit_ts.isoformat()
                if len(builder) >= spec.rows_per_arrow_batch:
                    yield builder.flush()
                    if not yielded:
                        yielded = True
                        faults.crash_if("mid-write", spec.fault)
        outcome.open_transaction_at_end = bool(getattr(assembler, "in_transaction", False))
        if len(builder):
            yield builder.flush()
            if not yielded:
                faults.crash_if("mid-write", spec.fault)
    except PgpollError as exc:
        outcome.error = exc
    except Exception as exc:  # reported to the driver, which decides the exit code
        outcome.error = PgpollError(f"batch task failed: {type(exc).__name__}: {exc}", "run again with PGPOLL_DEBUG=1")
    finally:
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


def _peak_rss_kb() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def spark_task(spec: BatchSpec, accumulator: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function given to ``mapInArrow``: runs :func:`iter_batch` and reports through ``accumulator``."""

    def run(_input: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in _input:
            pass
        outcome = BatchOutcome()
        try:
            yield from iter_batch(spec, outcome)
        finally:
            outcome.extra["task_peak_rss_kb"] = _peak_rss_kb()
            accumulator.add({"outcome": outcome})

    return run
