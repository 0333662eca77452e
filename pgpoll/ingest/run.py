"""One ingest run, coordinated on the driver: preflight, lease, recovery, fenced batches, advance.

The driver never handles change rows. Each batch is planned on the commit
log's last record, then staged by one Spark job (:mod:`pgpoll.ingest.batch_job`:
the task peeks the slot, decodes, and writes Parquet itself with pyarrow, or
streams Arrow to Spark's writer where pyarrow cannot reach the output); the
driver then commits it by creating the next commit-log record — the
compare-and-set that makes a run that lost a race exit 3 — and only then
advances the slot to the batch's last COMMIT (or non-transactional message)
LSN. A batch peeks at most ``--batch-wal`` of WAL (:mod:`pgpoll.ingest.batch_bounds`);
the batch whose peek reads to the end of WAL is preceded by the run's
heartbeat and takes it in, so the slot ends past everything the run saw (with
``--batch-changes`` or ``--max-changes``, where no peek is known to read to
the end, a run that catches up ends with a heartbeat batch of its own).
Exactly once rests on that fence, not on the lease, which only gives a
second run its fast "busy" answer.

Spark starts only when a batch needs it. For a local, ``file:`` or object-store
output (``s3:``, ``gs:``, ``az:``) the driver reads and writes the output
itself (no JVM), and a batch runs in the driver when Spark would be local
anyway, or else when its slot is at most a few megabytes of WAL behind
(:func:`pgpoll.ingest.batch_job.driver_batch_wal`): a run on a local Spark
never starts a SparkSession, and under ``spark-submit`` a scheduled run that
finds little or nothing new — the usual case of a 5-minute schedule — starts
none either. Other outputs (``hdfs:``...) go through Hadoop's filesystem, so
Spark starts first.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pgpoll import faults, stopping
from pgpoll.errors import ConfigError, PgpollError, PublicationNotFoundError, SinkError, SlotInvalidatedError, WrongPluginError
from pgpoll.ingest.batch_bounds import BATCH_WAL, batch_bounds
from pgpoll.ingest.batch_job import StoppedError, driver_batch_wal, run_batch
from pgpoll.ingest.decode_ranges import DECODE_PARALLELISM
from pgpoll.ingest.gap_check import check_output, check_slot_moved, confirm_server
from pgpoll.ingest.progress_channel import BatchProgressLog, ProgressListener
from pgpoll.ingest.task import BatchSpec
from pgpoll.lsn import Lsn
from pgpoll.observe.lineage import observed
from pgpoll.observe.runs import run_ended, run_started
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.lease import Lease, LeaseKeeper
from pgpoll.sink.parquet_writer import PYARROW, choose_writer
from pgpoll.sink.stores.filesystem import needs_spark
from pgpoll.sink.typed_tables import SchemaStore, stage_typed_tables
from pgpoll.source import slots as slot_access
from pgpoll.source.arrow_peek import choose_fetch, requested_fetch
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.control import ControlConnection
from pgpoll.source.names import check_identifier, check_slot_name
from pgpoll.source.publications import publication_exists
from pgpoll.spark.filesystems import check_local_output, connector_hint
from pgpoll.spark.session import configure_writes, local_master_expected, spark_session
from pgpoll.stopping import StopRequest
from pgpoll.table_patterns import TablePatterns

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
    max_changes: int | None = None
    max_batches: int | None = None
    max_seconds: float | None = None
    batch_changes: int | None = None  # rows per batch (upto_nchanges); None: bounded by WAL only
    batch_wal: int = BATCH_WAL  # bytes of WAL per batch (pgpoll.ingest.batch_bounds); 0: no budget
    decode_parallelism: int = DECODE_PARALLELISM  # parts of a batch decoded at once (pgpoll.ingest.decode_ranges)
    typed_tables: bool = False
    row_filters: tuple[str, ...] = ()
    dsn: str | None = None
    pushgateway: str | None = None  # None: PGPOLL_PUSHGATEWAY (pgpoll.observe.runs)


@dataclass
class RunSummary:
    """The JSON line a run prints on stdout (for Airflow's XCom)."""

    slot: str
    plugin: str | None = None
    batches: int = 0
    changes: int = 0
    bytes: int = 0
    first_lsn: str | None = None
    last_lsn: str | None = None
    lag_bytes: int | None = None
    seconds: float = 0.0
    batch_seconds: float = 0.0
    status: str = "ok"
    exit_code: int = 0
    fenced: bool | None = None  # False: the output's store cannot create files atomically (lease only)
    writer: str | None = None  # "pyarrow" (the batch task writes Parquet itself) or "spark" (Spark's writer)
    fetch: str | None = None  # how the batch task fetched the peek: "adbc" (pgoutput, into Arrow) or "psycopg2"
    spark_jobs: int = 0  # batches run as a Spark job (the others ran in the driver: small batches)
    task_peak_rss_kb: int | None = None
    recovery: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.__dict__, sort_keys=True)


def _publication_exists(conn: Any, *, name: str) -> bool:
    return publication_exists(conn, name)


def _preflight(control: ControlConnection, opts: IngestOptions) -> tuple[str, slot_access.SlotInfo]:
    info = control.slot_info()
    plugin = slot_access.check_plugin(info, opts.plugin)
    if info.wal_status == "lost":
        raise SlotInvalidatedError(
            f'slot "{opts.slot}" has lost WAL it needed (wal_status = lost)',
            "recreate the slot, then run `pgpoll resync` on the same output (see docs/how-to/lost-slot.md)",
        )
    if info.two_phase:
        raise WrongPluginError(
            f'slot "{opts.slot}" decodes prepared transactions (two_phase)',
            "create the slot without --two-phase for pgpoll ingest",
        )
    if opts.row_filters:
        from pgpoll.source.row_filter_check import checked_client_row_filters

        control.call(lambda c: checked_client_row_filters(c, plugin, opts.row_filters))
    if plugin == "pgoutput":
        if not opts.publications:
            raise ConfigError(  # a usage error (exit 2), as in `slot peek`; a named one that is missing is exit 4
                f'slot "{opts.slot}" uses pgoutput, which needs a publication', "pass --publication NAME"
            )
        for pub in opts.publications:
            check_identifier(pub, "publication name")
            if not control.call(functools.partial(_publication_exists, name=pub)):
                raise PublicationNotFoundError(
                    f'publication "{pub}" does not exist',
                    "create it: pgpoll publication create NAME --table schema.tbl",
                )
    return plugin, info


def _end_of_run_heartbeat(control: ControlConnection, run_id: str, plugin: str, opts: IngestOptions) -> dict[str, Any] | None:
    """Emit the end-of-run heartbeat, after reading the captured tables' write counters.

    The run's last batch then consumes the heartbeat and the slot is advanced
    past it, so ``lag_bytes`` right after a run that caught up is only the WAL
    written since. The counters (``pg_stat_user_tables``), read *before* the
    heartbeat and so before the last peek, go into that batch's commit-log
    record: ``pgpoll status`` compares them with the current ones, and equal
    counters mean no captured change can be pending. On a hot standby neither:
    nothing can be written there and its counters miss the primary's writes.
    """
    if control.on_standby():
        return None
    stats = _write_counts(control, plugin, opts)
    control.emit_heartbeat(run_id)
    return stats


def _open_sink(spark: Any, output: str, run_id: str) -> BatchSink:
    """The output's sink; a missing Hadoop filesystem connector (s3a:, gs:, abfs:) is named in the fix."""
    try:
        return BatchSink(spark, output, run=run_id)
    except SinkError as exc:
        hint = connector_hint(exc.message, output)
        if hint is None:
            raise
        raise SinkError(exc.message, hint) from None


def _write_counts(control: ControlConnection, plugin: str, opts: IngestOptions) -> dict[str, Any] | None:
    """The captured tables' cumulative write counters, for ``pgpoll status`` (None when they cannot be read).

    pgoutput: the publications' tables; test_decoding: every user table (a
    write to a table left out by ``--tables`` then counts as pending until the
    next run: an upper bound, never an underestimate).
    """
    from pgpoll.source.server_state import captured_tables, table_write_counts

    def read(conn: Any) -> dict[str, list[int]]:
        tables = captured_tables(conn, list(opts.publications)) if plugin == "pgoutput" else None
        return table_write_counts(conn, tables)

    try:
        counts = control.call(read)
        return {"read_at": datetime.now(UTC).isoformat(), "tables": counts}
    except PgpollError as exc:
        log.warning("could not read the tables' write counters (status lag falls back to commit times): %s", exc.message)
        return None


def _progress_listener(spark: Any, show: Callable[[str], None] | None) -> ProgressListener | None:
    """The driver's end of the progress side channel, on the address executors reach; None if it cannot listen.

    Without a SparkSession (batches in the driver only) it listens on the loopback address.
    """
    host = str(spark.conf.get("spark.driver.host", "127.0.0.1")) if spark is not None else "127.0.0.1"
    try:
        return ProgressListener(host, BatchProgressLog(show))
    except OSError as exc:
        log.debug("no progress channel on %s: %s", host, exc)
        return None


class _SparkOnDemand:
    """The run's SparkSession, started the first time a batch needs a Spark job (see the module docstring)."""

    def __init__(self, spark: Any, stop: StopRequest | None, show_progress: Callable[[str], None] | None) -> None:
        self.session = spark
        self.stop = stop
        self.show_progress = show_progress
        self.listener: ProgressListener | None = None
        self._ready = False

    def get(self) -> Any:
        """The session, started (and configured for pgpoll's writes) if it was not yet."""
        if self.session is None:
            self.session = spark_session("pgpoll-ingest")
        if not self._ready:
            configure_writes(self.session)
            stopping.reclaim(self.stop)  # SparkContext replaced the SIGINT handler with its own
            self._ready = True
            self._listen()
        return self.session

    def _listen(self) -> None:
        """(Re)open the progress channel where executors reach the driver."""
        if self.listener is not None:
            self.listener.close()
        self.listener = _progress_listener(self.session, self.show_progress)

    def progress_address(self) -> Any:
        """Where tasks send progress (a loopback channel until Spark starts)."""
        if self.listener is None:
            self._listen()
        return self.listener.address if self.listener is not None else None

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


@observed("ingest")  # OpenLineage START, then COMPLETE/FAIL/ABORT (when configured)
def run_ingest(
    opts: IngestOptions,
    spark: Any = None,
    on_batch: Callable[[RunSummary], None] | None = None,
    stop: StopRequest | None = None,
    show_progress: Callable[[str], None] | None = None,
) -> RunSummary:
    """:func:`drain`, recorded in the output's run history and pushed to a Pushgateway (failed runs too)."""
    run = run_started("ingest", output=opts.output, slot=opts.slot, pushgateway=opts.pushgateway)
    try:
        summary = drain(opts, spark, on_batch, stop, show_progress)
    except BaseException as error:
        run_ended(run, error=error, stopped=stop.exit_code if stop is not None and stop.requested else None)
        raise
    run_ended(run, status=summary.status, exit_code=summary.exit_code, batches=summary.batches,
              changes=summary.changes, bytes_=summary.bytes, lag_bytes=summary.lag_bytes)
    return summary


def drain(
    opts: IngestOptions,
    spark: Any = None,
    on_batch: Callable[[RunSummary], None] | None = None,
    stop: StopRequest | None = None,
    show_progress: Callable[[str], None] | None = None,
) -> RunSummary:
    """Drain the slot into the output within the limits; returns the run summary.

    ``on_batch`` is called with the summary so far after every committed
    batch (the CLI shows progress with it). Raises a :class:`PgpollError` on
    failure; the slot is then where the last committed batch left it.
    ``show_progress`` gets a line about the batch in flight about once a second
    (a terminal's live line); without it, a batch longer than 30 s logs a line
    every 30 s. When
    ``stop`` is requested (SIGINT/SIGTERM), the run stops at the next safe point
    and returns with ``status`` "interrupted" and exit code 128 + the signal.
    """
    started = time.monotonic()
    check_slot_name(opts.slot)
    if opts.row_filters:  # a malformed filter is a usage error: refuse it before connecting
        from pgpoll.rowfilter.expression import parse_row_filter

        for text in opts.row_filters:
            parse_row_filter(text)
    check_local_output(opts.output)  # a local output's problems are found before Spark's start-up
    fetch = requested_fetch()  # PGPOLL_FETCH: a bad value, or adbc where it is not installed, is exit 2 at once
    choose_fetch("pgoutput", fetch)
    summary = RunSummary(slot=opts.slot)
    sparks = _SparkOnDemand(spark, stop, show_progress)
    lease: Lease | None = None
    keeper: LeaseKeeper | None = None
    target = resolve_dsn(opts.dsn)
    fault = faults.configured()
    control = ControlConnection(target, opts.slot)
    control.open()
    run_id = uuid.uuid4().hex
    try:
        plugin, _info = _preflight(control, opts)
        summary.plugin = plugin
        # local and object-store outputs are read and written by the driver itself (no JVM: "busy" before Spark
        # starts); others through Hadoop's filesystem (Spark first)
        own = not needs_spark(opts.output)
        sink = _open_sink(None if own else sparks.get(), opts.output, run_id)
        sink.check_writable()  # a wrong secret, a missing bucket, a stopped store: exit 5 in seconds, nothing written
        lease = Lease(sink.fs, run=run_id, slot=opts.slot)
        lease.acquire()  # the fast "busy" answer (exit 3 at once); correctness rests on the commit log's fence
        keeper = LeaseKeeper(lease)
        report = sink.recover()
        summary.fenced = sink.fenced
        summary.recovery = report.as_json()
        server = check_output(control, sink, opts.output).server  # a gap: exit 4, nothing written, the slot unmoved
        schema_store = SchemaStore(sink.fs)
        options = tuple(slot_access.peek_options(plugin, publications=list(opts.publications)))
        patterns = TablePatterns(tuple(opts.tables), tuple(opts.exclude_tables))
        batches_started = time.monotonic()
        in_reach = own and choose_writer(sink.fs.path(layout.STAGING)) == PYARROW  # the driver can write it
        small_wal = driver_batch_wal(local_master_expected(spark)) if in_reach else 0
        heartbeat_sent = False  # the run's heartbeat: before a peek that reads to the end, else after catching up
        stats: dict[str, Any] | None = None
        growth = 1  # the WAL budget's factor: doubled after a bounded peek that found nothing new
        while True:
            if stop is not None and stop.requested:
                summary.status, summary.exit_code = "interrupted", stop.exit_code
                break
            if opts.max_batches is not None and summary.batches >= opts.max_batches:
                break
            if opts.max_seconds is not None and time.monotonic() - started >= opts.max_seconds:
                break
            limit = opts.batch_changes
            if opts.max_changes is not None:
                remaining = opts.max_changes - summary.changes
                if remaining <= 0:
                    break
                limit = remaining if limit is None else min(limit, remaining)
            if keeper is not None:
                keeper.check()
            check_slot_moved(control, sink, opts.output, Lsn.parse(summary.last_lsn) if summary.last_lsn else None)
            plan = sink.plan()  # planned on the commit log's head: it can only become the next record
            hwm = plan.high_water_mark
            number = summary.batches + 1
            slot_now = control.slot_info()
            lag = slot_now.lag_bytes
            bounds = batch_bounds(slot_now, hwm, batch_wal=opts.batch_wal, growth=growth, changes=limit)
            if bounds.to_end and not heartbeat_sent:  # this peek reads to the end: it takes the heartbeat in too
                stats = _end_of_run_heartbeat(control, run_id, plugin, opts)
                heartbeat_sent = True
            spec = BatchSpec(
                dsn=target.dsn, slot=opts.slot, plugin=plugin, options=options, upto_nchanges=bounds.upto_nchanges,
                upto_lsn=bounds.upto_lsn, high_water_mark=int(hwm) if hwm is not None else None, tables=patterns,
                fault=fault, row_filters=tuple(opts.row_filters), typed_tables=opts.typed_tables,
                progress=sparks.progress_address(), batch_number=number, fetch=fetch,
                decode_parallelism=opts.decode_parallelism)
            in_driver = small_wal > 0 and lag is not None and lag <= small_wal
            if not in_driver:
                sparks.get()
                spec = replace(spec, progress=sparks.progress_address())  # the channel executors reach
            if sparks.listener is not None:
                sparks.listener.start_batch(number)
            try:
                outcome = run_batch(sparks.session, sink, plan, spec, control, stop, in_driver=in_driver)
            except StoppedError:
                summary.status, summary.exit_code = "interrupted", stop.exit_code if stop is not None else 130
                break
            summary.writer = outcome.writer
            summary.fetch = outcome.fetch or summary.fetch
            summary.spark_jobs += 0 if in_driver else 1
            caught_up = bounds.caught_up(outcome.peeked_rows)  # the peek returned everything there was
            if outcome.advance_to is None or (hwm is not None and outcome.advance_to <= hwm):
                sink.discard(plan)
                if bounds.upto_lsn is not None:  # a transaction larger than the budget: peek further
                    growth *= 2
                    continue
                if caught_up and not heartbeat_sent:
                    stats = _end_of_run_heartbeat(control, run_id, plugin, opts)
                    heartbeat_sent = True
                    continue
                break
            growth = 1
            schemas = schema_store.save(outcome.schemas)
            typed = (
                stage_typed_tables(sparks.session if outcome.typed_files is not None else sparks.get(),
                                   sink.fs, plan.staging, schemas, outcome)
                if opts.typed_tables and outcome.changes else {}
            )
            faults.crash_if("after-write", fault)
            try:
                server = confirm_server(control, server)
                check_slot_moved(control, sink, opts.output, plan.high_water_mark)  # moved during the peek: exit 4
            except PgpollError:
                sink.discard(plan)
                raise
            start = outcome.first_commit_lsn if outcome.first_commit_lsn is not None else outcome.advance_to
            record = sink.publish(
                plan, start=start, end=outcome.advance_to, rows=outcome.changes, slot=opts.slot, plugin=plugin,
                last_commit_ts=outcome.last_commit_ts, first_commit_ts=outcome.first_commit_ts, tables=typed,
                table_stats=stats if heartbeat_sent and caught_up else None, publications=opts.publications,
                xid_min=outcome.xid_min, xid_max=outcome.xid_max, uploaded=outcome.uploaded, server=server.as_json(),
            )  # FenceLostError (exit 3) when another run published this record number first
            faults.crash_if("after-commit-log", fault)
            control.advance(Lsn(outcome.advance_to))
            faults.crash_if("after-advance", fault)
            summary.task_peak_rss_kb = max(summary.task_peak_rss_kb or 0, int(outcome.extra.get("task_peak_rss_kb", 0)))
            summary.batches += 1
            summary.changes += outcome.changes
            summary.bytes += record.bytes
            summary.first_lsn = summary.first_lsn or str(Lsn(start))
            summary.last_lsn = record.end
            log.info("batch %d committed: %d change(s), slot advanced to %s", summary.batches, outcome.changes, record.end)
            if on_batch is not None:
                on_batch(summary)
            if caught_up:
                if heartbeat_sent:
                    break
                stats = _end_of_run_heartbeat(control, run_id, plugin, opts)
                heartbeat_sent = True
        summary.batch_seconds = round(time.monotonic() - batches_started, 3)
        if summary.status == "ok":
            summary.lag_bytes = control.wal_lag()
    finally:
        if keeper is not None:
            keeper.stop()
        if lease is not None:
            try:
                lease.release()
            except PgpollError as exc:  # the lease only speeds up "busy"; it expires by itself
                log.warning("could not release the output's lease: %s", exc.message)
        sparks.close()
        control.close()
        summary.seconds = round(time.monotonic() - started, 3)
    return summary
