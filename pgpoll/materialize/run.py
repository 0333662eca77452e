"""One materialize run on the driver: which tables, from where, incremental or full, and writing the state.

For each typed table under ``PATH/tables/`` (only batches the commit log
lists), the state is written to ``DEST/<schema>.<table>/`` (default
``PATH/state/``) with ``_pgpoll_state.json`` beside the data recording the
commit-log position it reflects. The next run starts from that state and
applies only newer batches; ``--full`` (or a missing or unreadable state)
rebuilds from every batch, which gives the same result.

The new state is written beside the old one and swapped in after its state
record is created exclusively (:mod:`pgpoll.materialize.parquet_state`). One
run at a time per destination: a second one exits 3 at once
(:mod:`pgpoll.materialize.dest_lease`). ``--format delta`` writes each table
as a Delta table instead (:mod:`pgpoll.materialize.delta.state`).

A table with a complete snapshot (``pgpoll snapshot``) is materialized on top
of the latest one (:mod:`pgpoll.materialize.snapshot_merge`): the marker
records the snapshot id; a newer snapshot rebuilds the table from it and the
change log, otherwise new changes are applied incrementally, in both cases
only those the snapshot does not hold.

Small tables cost Spark jobs, not data: what a table's run asks of its new
changes before computing the state (their column descriptions, the last
TRUNCATE, the columns left as unchanged TOAST values) is one aggregation
(:mod:`pgpoll.materialize.change_summary`), and a few tables run at once
(:mod:`pgpoll.materialize.table_pool`), with the results and the error a
one-by-one run gives.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from pgpoll.errors import ConfigError, SinkError
from pgpoll.lsn import Lsn
from pgpoll.materialize.change_summary import ChangeSummary, identity_segments, latest_schema, summarize
from pgpoll.materialize.change_summary import replay_key as _replay_key
from pgpoll.materialize.dest_lease import DestLease
from pgpoll.materialize.driver.run import driver_state, in_driver, requested_engine
from pgpoll.materialize.parquet_state import ParquetState
from pgpoll.materialize.retained import Registration, rebuild_if_behind, retention_refusal
from pgpoll.materialize.run_types import REFUSED, refused_error
from pgpoll.materialize.run_types import MaterializeOptions as MaterializeOptions  # (imported from here too)
from pgpoll.materialize.run_types import TableState as TableState
from pgpoll.materialize.snapshot_input import SnapshotCatalog
from pgpoll.materialize.snapshot_merge import (
    RESNAPSHOT_FIX,
    added_columns_warning,
    base_frame,
    captured_after_gap,
    converged,
    gap_refusal,
    predates_warning,
    recheck_rows,
    resnapshot_command,
    select_records,
    snapshot_filter,
    snapshot_json,
)
from pgpoll.materialize.state import ComputedState, StateColumn, StateResult, materialize
from pgpoll.materialize.state_log import SCRATCH, stale_scratch
from pgpoll.materialize.state_log import STATE_FILE as STATE_FILE  # (imported from here by delta_state)
from pgpoll.materialize.table_pool import run_in_order
from pgpoll.materialize.visibility import SnapshotFilter
from pgpoll.observe.lineage import observed
from pgpoll.observe.runs import run_ended, run_started
from pgpoll.sink import layout
from pgpoll.sink.commit.compactions import CompactionMap, load_map, typed_files
from pgpoll.sink.commit.history import History
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.snapshot_store import complete_snapshots
from pgpoll.sink.stores.filesystem import check_readable, check_writable, needs_spark, open_output
from pgpoll.sink.typed_tables import SchemaStore, load_ledger
from pgpoll.stopping import StopRequest, StopRequestedError
from pgpoll.table_patterns import TablePatterns
from pgpoll.typed.mapping import spark_ddl
from pgpoll.typed.rows import quote
from pgpoll.typed.schemas import TableSchema

log = logging.getLogger("pgpoll.materialize")
# names the state and its computation use beside the table's own columns (internal ones start with __pgpoll_)
_STATE_META = {"_untyped", "_commit_lsn", "_commit_ts", "_seq"}
_CASE_SENSITIVE = "spark.sql.caseSensitive"


def _state_columns(described: TableSchema, ledger: Any) -> list[StateColumn]:
    out: list[StateColumn] = []
    for c in described.columns:
        ddl = spark_ddl(c.type)
        current = [e.physical for e in ledger.entries if e.name == c.name and e.ddl == ddl]
        others = [e.physical for e in ledger.entries if e.name == c.name and e.ddl != ddl]
        # a column named like a state meta column (_untyped, _commit_lsn...) keeps its stored, suffixed name
        name = current[0] if c.name.lower() in _STATE_META and current else c.name
        out.append(StateColumn(name, c.type, tuple(current + others)))
    return out


def _from_condition(start: tuple[int, int]) -> Any:
    from pyspark.sql import functions as F

    lsn, seq = start
    return (F.col("_commit_lsn") > lsn) | ((F.col("_commit_lsn") == lsn) & (F.col("_seq") >= seq))


def _from(events: Any, start: tuple[int, int]) -> Any:
    return events.where(_from_condition(start))


def _align(previous: Any, columns: list[StateColumn]) -> Any:
    from pyspark.sql import functions as F

    have = set(previous.columns)
    picked = [
        (F.col(quote(c.name)).cast(spark_ddl(c.type)) if c.name in have else F.lit(None).cast(spark_ddl(c.type))).alias(c.name)
        for c in columns
    ]
    return previous.select(*picked, "_untyped", "_commit_lsn", "_commit_ts")


class Materializer(ParquetState):
    """Materializes the typed tables of one output path.

    The output and DEST are opened without Spark when they are local paths or
    object stores (pgpoll's own clients); Spark starts only when a table's
    state needs a Spark job (:attr:`spark`), so a run the driver engine
    computes whole starts no JVM. Other URIs (``hdfs:``...) are Hadoop's:
    Spark starts first. How the state is kept (read back, written, published)
    is :class:`~pgpoll.materialize.parquet_state.ParquetState`'s, which the
    Delta and Iceberg materializers override.
    """

    def __init__(self, spark: Any, opts: MaterializeOptions, stop: StopRequest | None = None) -> None:
        self._spark = spark
        self._case_saved: str | None = None
        self._spark_lock = threading.Lock()  # tables run on a few threads (table_pool): one start
        self.opts = opts
        self.stop: StopRequest | None = stop  # checked before each table (SIGINT/SIGTERM: see pgpoll.stopping)
        if needs_spark(opts.output) or (opts.to is not None and needs_spark(opts.to)):
            spark = self.spark
        self.fs = open_output(opts.output, spark)
        dest = opts.to or self.fs.path(layout.STATE)
        self.dest = open_output(dest, spark)
        self.store = SchemaStore(self.fs)
        self.filter = TablePatterns(opts.tables, opts.exclude_tables)
        self.snapshots = SnapshotCatalog(self.fs)
        self.high_water: Lsn | None = None
        self.gap: CommitRecord | None = None
        self.rebuilt: set[str] = set()  # tables rebuilt on a newer snapshot (a state at the same position is replaced)
        self.pins: dict[str, int] = {}  # the state record each table's run builds on (pgpoll.materialize.state_log)
        self.summaries: dict[str, ChangeSummary] = {}  # per table: what one pass over its new changes found
        self.row_bounds: dict[str, int] = {}  # per table built without a previous state: at most this many rows
        self.compacted = CompactionMap(None)  # pgpoll compact's merges, read at the run's start
        self.read_after: dict[str, int] = {}  # per table: only changes past this commit_lsn (a merge holds older ones)
        self.engine = requested_engine()  # small tables of a local output in the driver (pgpoll.materialize.driver.run)

    @property
    def spark(self) -> Any:
        """The SparkSession, started on first use (a table that needs a Spark job), set for pgpoll's work."""
        with self._spark_lock:
            return self._start_spark()

    def _start_spark(self) -> Any:
        if self._spark is None:
            from pgpoll import stopping
            from pgpoll.spark.session import spark_session

            self._spark = spark_session("pgpoll-materialize")
            stopping.reclaim(self.stop)  # SparkContext replaced the SIGINT handler with its own
        if self._case_saved is None:
            from pgpoll.spark.session import configure_writes

            configure_writes(self._spark)
            # the state's columns are the table's own names: "A" and "a" are two columns in PostgreSQL
            self._case_saved = str(self._spark.conf.get(_CASE_SENSITIVE, "false"))
            self._spark.conf.set(_CASE_SENSITIVE, "true")
        return self._spark

    @property
    def spark_started(self) -> bool:
        """Whether this run has used Spark."""
        return self._case_saved is not None

    def run(self) -> list[TableState]:
        """Materialize every selected table; returns what was done for each."""
        if self.publishes_by_rename and self.dest.direct_writes:
            raise ConfigError(
                f"--format parquet publishes each table's state with directory renames, which {self.dest.root} "
                "(an object store) does not have",
                "materialize to an object store with --format delta (one atomic Delta commit per table and run)",
            )
        check_readable(self.fs)  # an unreachable store, a wrong secret: exit 5 in seconds, nothing written
        if self.dest.direct_writes:
            check_writable(self.dest)
        has_log = self.fs.exists(self.fs.path(layout.COMMITS))
        snapshotted = self.snapshots.table_dirs()
        if not has_log and not snapshotted:
            raise SinkError(f"{self.opts.output} holds no pgpoll output (no commit log)",
                            "run pgpoll ingest --typed-tables --output PATH first, or check the path")
        registration = Registration(self)  # before the log is read (pgpoll.materialize.retained)
        # the compaction map first: a merge then never holds a record newer than the state read next
        self.compacted = load_map(self.fs)
        # the commit log's state, not its records: each table reads only the records after its position
        history = History(CommitLog(self.fs) if has_log else None)
        self.high_water = history.high_water_mark
        self.gap = history.newest_gap()  # the newest gap `pgpoll resync` marked
        names = sorted(history.table_dirs() | snapshotted)
        if not names:
            registration.abandon()
            raise SinkError(f"{self.opts.output} has no typed tables",
                            "ingest with --typed-tables (changes written before that are in changes/ only)")
        with DestLease(self.dest, run=uuid.uuid4().hex[:12]):  # one materialize per DEST (exit 3 at once)
            states = self._run_tables(history, names)
        registration.end(states, history.high_water_mark)
        return states

    def _run_tables(self, history: History, names: list[str]) -> list[TableState]:
        for name, is_dir, _ in self.dest.list(self.dest.path("")):
            if is_dir and SCRATCH in name and stale_scratch(self.dest, name):
                self.dest.delete(self.dest.path(name))
        selected = [(n, p) for n in names if (p := layout.parse_table_dir_name(n)) is not None and self.filter.accepts(*p)]
        refused = {n: e for n, p in selected
                   if (e := retention_refusal(self, history, n, p) or self._gap_refusal(n, p, history)) is not None}
        try:  # a few tables at once, results and errors as one by one (pgpoll.materialize.table_pool)
            built = iter(run_in_order([functools.partial(self._one_table, n, p, history)
                                       for n, p in selected if n not in refused]))
        finally:
            if self._case_saved is not None:
                self._spark.conf.set(_CASE_SENSITIVE, self._case_saved)
        return [next(built) if n not in refused else TableState(
            f"{p[0]}.{p[1]}", self.dest.path(n), 0, None, REFUSED, warnings=[f"{refused[n].message}; fix: {refused[n].hint}"])
            for n, p in selected]

    def _gap_refusal(self, name: str, parsed: tuple[str, str], history: History) -> ConfigError | None:
        """Why the table is not built across the newest gap (None: it is covered, or missed nothing there).

        Per table: the tables that are covered are built, the refused ones
        are named in the run's result (the CLI exits 2 after printing it).
        """
        if self.gap is None:
            return None
        snap = self.snapshots.latest(*parsed)
        refusal = gap_refusal(self.gap, snap, f"{parsed[0]}.{parsed[1]}", self.opts.output)
        if refusal is None or captured_after_gap(self.gap, history.after(None, name), self._read_marker(name),
                                                 complete_snapshots(self.fs), snap):
            return None
        return refusal

    def _one_table(self, name: str, parsed: tuple[str, str], history: History) -> TableState:
        if self.stop is not None and self.stop.requested:
            raise StopRequestedError()  # between tables: every state written so far is whole
        return self._table(name, parsed, history)

    def _table(self, name: str, parsed: tuple[str, str], history: History) -> TableState:
        qualified = f"{parsed[0]}.{parsed[1]}"
        target = self.dest.path(name)
        snap = self.snapshots.latest(*parsed)
        marker = self._read_marker(name)
        if snap is not None and (marker is None or marker.get("snapshot_id") != snap.snapshot_id
                                 or marker.get("snapshot_rechecks_pending")):
            log.info("%s: building on snapshot %s", qualified, snap.snapshot_id)
            # a newer snapshot, or recheck rows not applied yet (the change log had not converged): rebuild the
            # table from the snapshot and the change log
            marker = None
            self.rebuilt.add(name)
        marker = rebuild_if_behind(history, name, marker, self.rebuilt)  # on the snapshot holding what retain removed
        snapshot_info = snapshot_json(snap, self.high_water)
        position = Lsn.parse(marker["position"]) if marker else None
        since = position
        if self.gap is not None and (since is None or since < self.gap.end_lsn):
            # built on the snapshot planned after the gap (checked above), from the records after it: a record before
            # the gap ends at or below its end (the high-water mark then), every record after it past its resume
            since = self.gap.end_lsn
        todo = history.after(since, name)  # the table's records after the position (all: a rebuild)
        if self.gap is not None:
            todo = [r for r in todo if r.seq > self.gap.seq]
        if marker and not todo:
            return TableState(qualified, target, int(marker.get("rows", 0)), marker["position"], "unchanged",
                              snapshot=snapshot_info)
        shape = snap.shape if snap is not None else None
        if shape is not None and marker is None:
            self.store.save({shape.schema_id: shape.to_json()})  # the state's marker may name it
        rule: SnapshotFilter | None = None
        read = todo
        if snap is not None and shape is not None:
            rule = snapshot_filter(snap, shape, _state_columns(shape, load_ledger(self.fs, *parsed)))
            read = select_records(todo, snap, rule)
        # a record that names the table wrote its partition there (records without one have no tables)
        files = self.table_files(name, read)
        partitions = list(dict.fromkeys(f.rsplit("/", 1)[0] for f, _size in files))
        if since is not None and self.compacted.covers_more(read):
            self.read_after[name] = int(since)  # a merge also holds changes the state has: read past its position
        computed = None
        if snap is None and in_driver(self, name, read, marker, files):  # a small table: no Spark job
            computed = driver_state(self, name, parsed, files, marker)
        if computed is None:
            computed = self._spark_state(name, parsed, snap, rule, partitions, marker, [f for f, _s in files])
        warnings = computed.warnings
        if computed.unresolved_toast and snap is not None and snap.rechecks and converged(snap, self.high_water):
            warnings.append(
                f"{qualified}: {computed.unresolved_toast} row(s) lack an unchanged TOAST value (left null): they "
                f"changed key twice while snapshot {snap.snapshot_id} read the table, the second time during its "
                f"recheck; fix: run {resnapshot_command(qualified)}"
            )
        elif computed.unresolved_toast:
            warnings.append(
                f"{qualified}: {computed.unresolved_toast} row(s) keep an unchanged TOAST value that predates the "
                f"captured history (left null); fix: run {resnapshot_command(qualified)}"
            )
        for w in warnings:
            log.warning("%s", w)
        end = todo[-1].end if todo else (marker["position"] if marker else "0/0")
        meta: dict[str, Any] = {"position": end, "schema_id": computed.described.schema_id, "table": qualified}
        if snap is not None:
            meta["snapshot_id"] = snap.snapshot_id
            if snap.rechecks and not converged(snap, self.high_water):
                meta["snapshot_rechecks_pending"] = True  # the next run rebuilds from the snapshot
        if computed.table is not None:
            rows = self._write_arrow(name, computed.table, meta, computed.key)
        else:
            rows = self._write(name, computed.frame, meta, computed.key)
        return TableState(qualified, target, rows, end, "incremental" if marker else "full", len(read), warnings,
                          snapshot=snapshot_info, engine="spark" if computed.table is None else "driver")

    def table_files(self, name: str, records: Sequence[CommitRecord]) -> list[tuple[str, int]]:
        """The typed files of table directory ``name`` holding ``records``' rows, with their sizes: each record's
        own, or the merge of ``pgpoll compact`` now holding them (:func:`pgpoll.sink.commit.compactions.typed_files`)."""
        return typed_files(self.fs, name, records, self.compacted)

    def read_parquet(self, fs: Any, paths: Sequence[str], files: bool = False) -> Any:
        """A Spark frame of Parquet ``paths`` (directories, or ``files``) with schemas merged; on an object store
        the files are read by the tasks with pyarrow (:mod:`pgpoll.spark.arrow_files`: no Hadoop connector)."""
        if fs.direct_writes:
            from pgpoll.spark.arrow_files import files_frame, merged_schema

            listed = list(paths) if files else [f"{p}/{n}" for p in paths for n, d, _s in fs.list(p)
                                                 if not d and n.endswith(".parquet")]
            return files_frame(self.spark, fs, listed, merged_schema(fs, listed))
        return self.spark.read.option("mergeSchema", "true").parquet(*paths)

    def _spark_state(self, name: str, parsed: tuple[str, str], snap: Any, rule: SnapshotFilter | None,
                     partitions: list[str], marker: dict[str, Any] | None, files: Sequence[str] = ()) -> ComputedState:
        """The table's new state as a Spark frame (:mod:`pgpoll.materialize.state`)."""
        qualified = f"{parsed[0]}.{parsed[1]}"
        shape = snap.shape if snap is not None else None
        events = None
        if partitions:
            events = self.read_parquet(self.fs, files, files=True) if self.fs.direct_writes else self.read_parquet(
                self.fs, partitions)
            if name in self.read_after:
                events = events.where(events["_commit_lsn"] > self.read_after[name])
        if events is not None and rule is not None and "_xid" not in events.columns:
            raise SinkError(f"{qualified}: the typed changes after snapshot {snap.snapshot_id} have no _xid column "
                            "(written by an older pgpoll ingest)", RESNAPSHOT_FIX)
        floor = ((snap.plan_lsn, -1), shape) if snap is not None and shape is not None and marker is None else None
        summary = self.summaries[name] = summarize(events) if events is not None else ChangeSummary()
        described, columns, key, warnings = self.describe(parsed, summary, marker, floor, shape)
        renamed = {c.name: s.name for c, s in zip(described.columns, columns, strict=True)}
        rechecks = None
        if snap is not None:
            rule = snapshot_filter(snap, described, columns)
            previous = (_align(self._read_previous(name, events, key, columns), columns) if marker
                        else base_frame(self.spark, snap, described, columns,
                                        lambda files: self.read_parquet(self.fs, files, files=True)))
            rechecks = None if marker else recheck_rows(self.spark, snap, described, columns, self.high_water,
                                                        lambda files: self.read_parquet(self.fs, files, files=True))
        else:
            previous = _align(self._read_previous(name, events, key, columns), columns) if marker else None
            if marker is None and key and summary.touches:  # (only UPDATEs and DELETEs can touch such rows)
                found = predates_warning(events, {c.name: c.physical[0] for c in columns if c.name in key and c.physical},
                                         qualified)
                warnings += [found] if found else []
        if previous is None:
            self.row_bounds[name] = summary.row_changes  # the state holds no more rows than these (laid out by it)
        segments = identity_segments(summary, self.store) if events is not None else []
        if events is not None and len(segments) > 1:
            # the table's replica identity changed: replay each stretch the way it was written
            unresolved = 0
            for i, (start, shape_i) in enumerate(segments):
                stretch = _from(events, start) if i else events
                if i + 1 < len(segments):
                    stretch = stretch.where(~_from_condition(segments[i + 1][0]))
                part = materialize(stretch, previous, columns, [renamed.get(k, k) for k in _replay_key(shape_i)], rule,
                                   rechecks=rechecks)
                previous = part.frame.localCheckpoint()
                unresolved += part.unresolved_rows if part.unresolved_rows is not None else part.unresolved_toast
            result = StateResult(previous, unresolved)
        else:
            result = materialize(events, previous, columns, key, rule, summary, rechecks)
        unresolved = result.unresolved_rows if result.unresolved_rows is not None else result.unresolved_toast
        return ComputedState(described, key, warnings, unresolved, frame=result.frame)

    def describe(self, parsed: tuple[str, str], summary: ChangeSummary, marker: dict[str, Any] | None,
                 floor: tuple[tuple[int, int], TableSchema] | None, shape: TableSchema | None,
                 ) -> tuple[TableSchema, list[StateColumn], list[str], list[str]]:
        """The state's shape from the changes' newest one: its description, columns, key (state names) and the
        warnings it calls for (no key, columns added since the previous state)."""
        qualified = f"{parsed[0]}.{parsed[1]}"
        described = latest_schema(summary, self.store, marker["schema_id"] if marker else None, floor)
        if described is None and marker is not None:
            described = self.store.load(marker["schema_id"])
        if described is None:
            raise SinkError(f"no column description found for {qualified}", "rerun pgpoll materialize --full")
        warnings: list[str] = []
        if not described.key:
            warnings.append(
                f"{qualified} has no replica identity key: its UPDATEs and DELETEs cannot be matched to rows; "
                f"fix: ALTER TABLE {qualified} ADD PRIMARY KEY (...) or REPLICA IDENTITY FULL, then run "
                f"{resnapshot_command(qualified)}"
            )
        earlier = shape if marker is None else self.store.load(marker["schema_id"])
        added = added_columns_warning(earlier, described, qualified)
        warnings += [added] if added else []
        columns = _state_columns(described, load_ledger(self.fs, *parsed))
        renamed = {c.name: s.name for c, s in zip(described.columns, columns, strict=True)}
        return described, columns, [renamed.get(k, k) for k in _replay_key(described)], warnings


@observed("materialize")  # OpenLineage START, then COMPLETE/FAIL/ABORT (when configured)
def run_materialize(
    opts: MaterializeOptions, spark: Any = None, *, materializer: type[Materializer] | None = None,
    stop: StopRequest | None = None,
) -> list[TableState]:
    """Materialize the typed tables of ``opts.output``; see :class:`Materializer` (or ``materializer``,
    e.g. :class:`pgpoll.materialize.delta.state.DeltaMaterializer`). Without ``spark``, one is started only
    when a table needs a Spark job."""
    run = run_started("materialize", output=opts.output, pushgateway=opts.pushgateway)
    try:
        states = (materializer or Materializer)(spark, opts, stop=stop).run()
    except BaseException as error:
        run_ended(run, error=error, stopped=stop.exit_code if stop is not None and stop.requested else None)
        raise
    status, code = ("interrupted", stop.exit_code) if stop is not None and stop.requested else ("ok", 0)
    refusal = refused_error(states) if code == 0 else None  # tables refused across a gap: a failed run (exit 2)
    run_ended(run, status=status, exit_code=code, batches=sum(s.batches for s in states),
              changes=sum(s.rows for s in states), error=refusal)
    return states
