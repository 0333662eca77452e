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

from pgpoll.changes import Begin, Commit, Ignored, LogicalMessage, RowChange, Truncate
from pgpoll.errors import DecodeError, PgpollError
from pgpoll.ingest import faults
from pgpoll.ingest.batch_assembler import BatchAssembler
from pgpoll.lsn import Lsn


@dataclass(frozen=True)
class TableFilter:
    """``--tables`` / ``--exclude-tables``: shell patterns over ``schema.table``."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def accepts(self, schema: Optional[str], table: Optional[str]) -> bool:
        """True when changes of ``schema.table`` belong in the output."""
        if table is None or not (self.include or self.exclude):
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
    fault: Optional[str] = None
    row_filters: tuple[str, ...] = ()  # --row-filter specs (test_decoding), parsed again on the executor

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
    schemas: dict[str, str] = field(default_factory=dict)  # schema id -> TableSchema JSON
    extra: dict[str, Any] = field(default_factory=dict)


def make_decoder(plugin: str, proto_version: int) -> Callable[[Any, Optional[Lsn], Optional[int]], Any]:
    """A function ``(data, lsn, xid) -> Event`` for the plugin."""
    if plugin == "pgoutput":
        from pgpoll.decode.pgoutput import PgoutputDecoder

        pg = PgoutputDecoder(proto_version)

        def decode_binary(data: Any, lsn: Optional[Lsn], xid: Optional[int]) -> Any:
            return pg.decode(data, lsn)

        decode_binary.fast_row = pg.decode_row  # type: ignore[attr-defined]
        decode_binary.type_names = pg.types  # type: ignore[attr-defined]
        return decode_binary
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
    from pgpoll.source.connection import ConnectionTarget, connect
    from pgpoll.source.slots import peek_rows

    from pgpoll.source.catalog import catalog_table

    conn = None
    decode = make_decoder(spec.plugin, spec.proto_version)
    row_filters = None
    if spec.row_filters:
        from pgpoll.rowfilter.evaluate import TableFilters
        from pgpoll.rowfilter.expression import parse_row_filter

        row_filters = TableFilters([parse_row_filter(s) for s in spec.row_filters])
    asm = BatchAssembler(
        high_water_mark=spec.high_water_mark, accepts=spec.table_filter.accepts,
        rows_per_batch=spec.rows_per_arrow_batch, type_names=getattr(decode, "type_names", None),
        catalog=lambda schema, table: catalog_table(conn, schema, table), row_filters=row_filters,
    )
    try:
        conn = connect(ConnectionTarget(spec.dsn, "task"), application_name=f"pgpoll ingest {spec.slot}")
        fast_row = getattr(decode, "fast_row", None)
        rows = peek_rows(
            conn, spec.slot, spec.plugin, upto_nchanges=spec.upto_nchanges, options=list(spec.options), raw_text=True
        )

        def batches() -> Iterator[pa.RecordBatch]:
            for lsn, xid, data in rows:
                outcome.peeked_rows += 1
                if outcome.peeked_rows == 1:
                    faults.crash_if("after-peek", spec.fault)
                try:
                    fields = fast_row(data) if fast_row is not None else None
                    if fields is not None:
                        yield from asm.row_fields(fields, lsn)
                    else:
                        yield from _dispatch(asm, decode(data, lsn, xid), lsn)
                except DecodeError as exc:
                    outcome.error = exc
                    outcome.reject = _reject(lsn, xid, data, exc, outcome.peeked_rows)
                    return
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
        outcome.schemas = {sid: described.to_json() for sid, described in asm.schemas.items()}
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


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
