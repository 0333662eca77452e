"""One ingest run, coordinated on the driver: lock, preflight, recovery, batches, advance.

The driver never handles change rows. Each batch is one Spark job: a single
task peeks the slot and streams Arrow batches to Spark's Parquet writer
(``pgpoll.ingest.task``) into a staging directory; the driver then publishes
the batch (``pgpoll.sink.batches``), records it in the commit log, and only
then advances the slot to the batch's last COMMIT (or non-transactional
message) LSN.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pgpoll.errors import (
    ConfigError,
    PublicationNotFoundError,
    SinkError,
    SlotInvalidatedError,
    WrongPluginError,
)
from pgpoll.ingest import faults
from pgpoll.ingest.control import ControlConnection, retrying
from pgpoll.ingest.task import BatchOutcome, BatchSpec, TableFilter, spark_task
from pgpoll.lsn import Lsn
from pgpoll.sink.batches import BatchSink
from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.typed_tables import SchemaStore, stage_typed_tables
from pgpoll.source import slots as slot_access
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.names import check_identifier, check_slot_name
from pgpoll.source.publications import publication_exists

log = logging.getLogger("pgpoll.ingest")


@dataclass(frozen=True)
class IngestOptions:
    """The options of ``pgpoll ingest`` and ``jobs/ingest.py`` (same names)."""

    slot: str
    output: str
    plugin: str = "auto"
    publications: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    max_changes: Optional[int] = None
    max_batches: Optional[int] = None
    max_seconds: Optional[float] = None
    batch_changes: int = 200_000
    typed_tables: bool = False
    row_filters: tuple[str, ...] = ()
    dsn: Optional[str] = None


@dataclass
class RunSummary:
    """The JSON line a run prints on stdout (for Airflow's XCom)."""

    slot: str
    plugin: Optional[str] = None
    batches: int = 0
    changes: int = 0
    bytes: int = 0
    first_lsn: Optional[str] = None
    last_lsn: Optional[str] = None
    lag_bytes: Optional[int] = None
    seconds: float = 0.0
    batch_seconds: float = 0.0
    status: str = "ok"
    exit_code: int = 0
    task_peak_rss_kb: Optional[int] = None
    recovery: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.__dict__, sort_keys=True)


class _Outcomes:
    """AccumulatorParam keeping the latest outcome reported by the batch task."""

    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 (Spark's name)
        a.update(b)
        return a


def _spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("pgpoll-ingest")
    if not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    return builder.getOrCreate()


def _preflight(control: ControlConnection, opts: IngestOptions) -> tuple[str, slot_access.SlotInfo]:
    info = control.slot_info()
    plugin = slot_access.check_plugin(info, opts.plugin)
    if info.wal_status == "lost":
        raise SlotInvalidatedError(
            f'slot "{opts.slot}" has lost WAL it needed (wal_status = lost)',
            "drop and recreate the slot, then re-snapshot the captured tables",
        )
    if info.two_phase:
        raise WrongPluginError(
            f'slot "{opts.slot}" decodes prepared transactions (two_phase)',
            "create the slot without --two-phase for pgpoll ingest",
        )
    if opts.row_filters:
        if plugin != "test_decoding":
            raise ConfigError(
                "--row-filter is for test_decoding slots; with pgoutput the server applies publication row filters",
                "put the filter on the publication: pgpoll publication create NAME --table 'schema.tbl WHERE (expr)'",
            )
        from pgpoll.rowfilter.expression import parse_row_filter
        from pgpoll.source.row_filter_check import check_row_filters

        filters = [parse_row_filter(spec) for spec in opts.row_filters]
        control.call(lambda c: check_row_filters(c, filters))
    if plugin == "pgoutput":
        if not opts.publications:
            raise PublicationNotFoundError("pgoutput needs a publication", "pass --publication NAME")
        for pub in opts.publications:
            check_identifier(pub, "publication name")
            if not control.call(lambda c, p=pub: publication_exists(c, p)):
                raise PublicationNotFoundError(
                    f'publication "{pub}" does not exist',
                    "create it: pgpoll publication create NAME --table schema.tbl",
                )
    return plugin, info


def _run_batch(spark: Any, sink: BatchSink, spec: BatchSpec, control: ControlConnection) -> tuple[str, BatchOutcome]:
    """One Spark job; returns the staging path and the task's outcome (retried when transient).

    Before every attempt the slot is re-advanced to the high-water mark: a
    server crash can return the slot to its last checkpointed position, and a
    peek from there would show only changes the output already holds.
    """
    for attempt in retrying():
        with attempt:
            if spec.high_water_mark is not None:
                control.advance(Lsn(spec.high_water_mark))
            staging = sink.staging_path()
            acc = spark.sparkContext.accumulator({}, _Outcomes())
            frame = spark.range(1, numPartitions=1).mapInArrow(spark_task(spec, acc), SPARK_DDL)
            try:
                frame.write.mode("errorifexists").parquet(staging)
            except Exception as exc:
                if spec.fault in faults.TASK_POINTS:
                    faults.crash_if(spec.fault, spec.fault)
                sink.discard(staging)
                raise SinkError(f"writing the batch failed: {_first_line(exc)}", "check that the output is writable") from None
            outcome: Optional[BatchOutcome] = acc.value.get("outcome")
            if outcome is None:
                sink.discard(staging)
                raise SinkError("the batch task reported nothing", "check the Spark executor logs")
            if outcome.error is not None:
                sink.discard(staging)
                if outcome.reject is not None:
                    _save_reject(sink, outcome.reject)
                raise outcome.error
            return staging, outcome
    raise AssertionError("unreachable")  # pragma: no cover


def _save_reject(sink: BatchSink, reject: dict[str, Any]) -> None:
    lsn = Lsn.parse(reject["lsn"])
    path = sink.fs.path("_pgpoll/rejects", f"{lsn.padded()}-{uuid.uuid4().hex[:8]}.json")
    sink.fs.write_text(path, json.dumps(reject, sort_keys=True))
    log.error("undecodable row saved to %s", path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def run_ingest(
    opts: IngestOptions, spark: Any = None, on_batch: Optional[Callable[[RunSummary], None]] = None
) -> RunSummary:
    """Drain the slot into the output within the limits; returns the run summary.

    ``on_batch`` is called with the summary so far after every committed
    batch (the CLI shows progress with it). Raises a :class:`PgpollError` on
    failure; the slot is then where the last committed batch left it.
    """
    started = time.monotonic()
    check_slot_name(opts.slot)
    if opts.row_filters:  # a malformed filter is a usage error: refuse it before connecting
        from pgpoll.rowfilter.expression import parse_row_filter

        for spec in opts.row_filters:
            parse_row_filter(spec)
    summary = RunSummary(slot=opts.slot)
    target = resolve_dsn(opts.dsn)
    fault = faults.configured()
    control = ControlConnection(target, opts.slot)
    control.open()
    try:
        plugin, info = _preflight(control, opts)
        summary.plugin = plugin
        spark = spark or _spark_session()
        sink = BatchSink(spark, opts.output)
        sink.check_writable()
        report = sink.recover(slot=opts.slot, plugin=plugin)
        summary.recovery = {
            "high_water_mark": str(report.high_water_mark) if report.high_water_mark else None,
            "removed_staging": report.removed_staging,
            "adopted": list(report.adopted),
            "removed_partitions": list(report.removed_partitions),
        }
        schema_store = SchemaStore(sink.fs)
        hwm = report.high_water_mark  # each batch first re-advances the slot to it (it may be behind after a crash)
        control.emit_heartbeat(uuid.uuid4().hex)
        options = tuple(slot_access.peek_options(plugin, publications=list(opts.publications)))
        table_filter = TableFilter(tuple(opts.tables), tuple(opts.exclude_tables))
        batches_started = time.monotonic()
        while True:
            if opts.max_batches is not None and summary.batches >= opts.max_batches:
                break
            if opts.max_seconds is not None and time.monotonic() - started >= opts.max_seconds:
                break
            limit = opts.batch_changes
            if opts.max_changes is not None:
                remaining = opts.max_changes - summary.changes
                if remaining <= 0:
                    break
                limit = min(limit, remaining)
            spec = BatchSpec(
                dsn=target.dsn, slot=opts.slot, plugin=plugin, options=options, upto_nchanges=limit,
                high_water_mark=int(hwm) if hwm is not None else None, table_filter=table_filter, fault=fault,
                row_filters=tuple(opts.row_filters),
            )
            staging, outcome = _run_batch(spark, sink, spec, control)
            if outcome.advance_to is None or (hwm is not None and outcome.advance_to <= hwm):
                sink.discard(staging)
                break  # caught up: nothing new
            schemas = schema_store.save(outcome.schemas)
            typed = stage_typed_tables(spark, sink.fs, staging, schemas) if opts.typed_tables and outcome.changes else {}
            faults.crash_if("after-write", fault)
            start = outcome.first_commit_lsn if outcome.first_commit_lsn is not None else outcome.advance_to
            record = sink.publish(
                staging, start=start, end=outcome.advance_to, rows=outcome.changes, slot=opts.slot, plugin=plugin,
                last_commit_ts=outcome.last_commit_ts, tables=typed,
            )
            faults.crash_if("after-commit-log", fault)
            control.advance(Lsn(outcome.advance_to))
            faults.crash_if("after-advance", fault)
            hwm = Lsn(outcome.advance_to)
            summary.task_peak_rss_kb = max(summary.task_peak_rss_kb or 0, int(outcome.extra.get("task_peak_rss_kb", 0)))
            summary.batches += 1
            summary.changes += outcome.changes
            summary.bytes += sum(s for n, _d, s in sink.fs.list(sink.fs.path("changes", record.partition)) if n.startswith("part-")) if record.partition else 0
            summary.first_lsn = summary.first_lsn or str(Lsn(start))
            summary.last_lsn = str(hwm)
            log.info("batch %d committed: %d change(s), slot advanced to %s", summary.batches, outcome.changes, hwm)
            if on_batch is not None:
                on_batch(summary)
            if outcome.peeked_rows < limit:
                break  # the peek returned everything there was
        summary.batch_seconds = round(time.monotonic() - batches_started, 3)
        summary.lag_bytes = control.wal_lag()
    finally:
        control.close()
        summary.seconds = round(time.monotonic() - started, 3)
    return summary
