"""Materializing a table on top of its latest complete snapshot: base rows, which batches to read, warnings.

The snapshot's rows are the *base facts* of the state: older than every
change. :mod:`pgpoll.materialize.visibility` decides which changes the
snapshot already holds; this module prepares what that needs from the run:

* :func:`base_frame`: the chunk rows as a state frame (typed columns by
  their ``physical`` name in the snapshot files, cast to the state's types,
  matched to state columns by column name);
* :func:`select_records`: the commit-log records whose changes can matter.
  A batch whose every transaction is below every chunk's ``xmin`` is visible
  to all chunks and is not read. Batches written before ingest recorded
  full transaction ids (``xid_min`` null) cannot be placed: those that end
  at or before the snapshot's plan LSN are taken as visible; a later one is
  an error (exit 5) whose fix is a new snapshot;
* :func:`snapshot_filter`: the visibility rule with the chunks' key ranges
  in state column names and types;
* :func:`recheck_rows`: the rows the snapshot's recheck read again, where
  unchanged TOAST values no chunk holds are found
  (:mod:`pgpoll.materialize.recheck_fill`), once the change log is converged;
* :func:`snapshot_json` (``materialize --json``); :func:`predates_warning`
  (a table without a snapshot whose changes show it held rows before the slot)
  and :func:`added_columns_warning` (columns added after rows were read, whose
  default PostgreSQL never sends as changes): only a snapshot fixes those;
* :func:`gap_refusal`: a table is built across a gap that ``pgpoll resync``
  marked only on a snapshot planned after the gap (the gap's changes are in
  no batch: only such a snapshot holds their effect), unless
  :func:`captured_after_gap` shows it missed nothing there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgpoll.errors import ConfigError, SinkError
from pgpoll.lsn import Lsn
from pgpoll.materialize.recheck_fill import RecheckRows
from pgpoll.materialize.snapshot_input import SHARED, TableSnapshot
from pgpoll.materialize.state import StateColumn
from pgpoll.materialize.visibility import ChunkRange, SnapshotFilter
from pgpoll.sink.commit.log import CommitRecord
from pgpoll.typed.mapping import spark_ddl
from pgpoll.typed.rows import quote
from pgpoll.typed.schemas import TableSchema

RESNAPSHOT_FIX = "run `pgpoll snapshot` again: ingest now writes full transaction ids"


def resnapshot_command(qualified: str) -> str:
    """The command that repairs one table."""
    return f"`pgpoll snapshot --tables {qualified}`"


def gap_refusal(gap: CommitRecord, snap: TableSnapshot | None, qualified: str, output: str) -> ConfigError | None:
    """The refusal (exit 2) to build ``qualified`` across ``gap`` without a complete snapshot planned after it.

    Such a snapshot was read after the slot's new position (``resume``), so it
    holds the effect of every change the gap lacks, and the records after the
    gap hold everything since; the records before the gap are not read.
    """
    resume = Lsn.parse(gap.resume) if gap.resume is not None else gap.end_lsn
    if snap is not None and gap.covered_by(snap.plan_lsn, snap.server):
        return None
    have = f"its newest complete snapshot {snap.snapshot_id} is older" if snap is not None else "it has no complete snapshot"
    if snap is not None and snap.plan_lsn >= int(resume):
        have = f"its newest complete snapshot {snap.snapshot_id} was not read from the server the gap names"
    lacks = (f"holds changes in ({gap.start}, {gap.end}] the server never had and lacks the server's up to {resume}"
             if gap.new_history else f"lacks the changes in ({gap.start}, {resume}]")
    return ConfigError(
        f"{qualified}: the output {lacks} (the gap marked at commit-log record "
        f"{gap.seq}) and {have}: a state built across the gap would miss them",
        f"finish `pgpoll resync --slot {gap.slot} --output {output}` (or run {resnapshot_command(qualified)}), "
        "then materialize again",
    )


def captured_after_gap(gap: CommitRecord, records: Sequence[CommitRecord], marker: Mapping[str, Any] | None,
                       snapshots: Sequence[tuple[Any, Mapping[str, Any], Any]], snap: TableSnapshot | None) -> bool:
    """Whether a table without a snapshot after ``gap`` is known to have missed nothing in it.

    Its rows from before the gap are missing from a state built on the
    records after it only if the table was captured (and had rows) then, so
    the answer is yes only when everything says it was not: no snapshot of
    it (``snap``: one from before the gap says it existed), no state built
    before the gap (``marker``), none of its ``records`` (all of them, in
    order) at or before the gap, and a complete snapshot planned after the
    gap's ``resume`` over the whole publication (no ``--tables`` or
    ``--exclude-tables``: the resync's) that does not hold the table, while
    its first record comes after that snapshot's plan: it joined the
    publication after the resync read it. In any other case (a resync
    interrupted or restricted, a table that was captured before) it is
    refused, naming the snapshot that repairs it.
    """
    if snap is not None:
        return False  # snapshotted before the gap (one after it covers the table: not asked)
    if marker is not None and Lsn.parse(str(marker["position"])) <= gap.end_lsn:
        return False  # a state from before the gap: rows it lacks the gap's changes for
    if not records or records[0].seq < gap.seq:
        return False
    resume = int(Lsn.parse(gap.resume)) if gap.resume is not None else int(gap.end_lsn)
    first = int(Lsn.parse(records[0].start))
    for _store, plan, _done in snapshots:
        args = plan.get("args", {})
        if args.get("tables") or args.get("exclude_tables"):
            continue  # a restricted snapshot says nothing about the tables it left out
        plan_lsn = int(plan.get("plan_lsn_int", 0))
        if resume <= plan_lsn <= first and gap.covered_by(plan_lsn, plan.get("server")):
            return True  # (the caller asks only for tables no snapshot after the gap holds)
    return False


def snapshot_filter(snap: TableSnapshot, described: TableSchema, columns: Sequence[StateColumn]) -> SnapshotFilter:
    """The visibility rule of ``snap`` for a state with ``columns`` (``described``'s columns, in order)."""
    by_name = {d.name: s for d, s in zip(described.columns, columns, strict=True)}
    if snap.mode == SHARED or not snap.key:
        shots = {c.snapshot for c in snap.chunks}
        if len({(s.xmin, s.xmax, frozenset(s.xip)) for s in shots}) > 1:
            raise SinkError(f"snapshot {snap.snapshot_id} of {snap.qualified} is shared but its chunks were read "
                            "under different snapshots", f"run {resnapshot_command(snap.qualified)}")
        return SnapshotFilter(tuple(ChunkRange(None, None, c.snapshot) for c in snap.chunks[:1]))
    missing = [k for k in snap.key if k not in by_name]
    if missing:
        raise SinkError(f"{snap.qualified}: key column(s) {', '.join(missing)} of snapshot {snap.snapshot_id} "
                        "are no longer in the table", f"run {resnapshot_command(snap.qualified)}")
    key = tuple(by_name[k].name for k in snap.key)
    ddls = tuple(spark_ddl(by_name[k].type) for k in snap.key)
    return SnapshotFilter(tuple(ChunkRange(c.lo, c.hi, c.snapshot) for c in snap.chunks), key, ddls)


def select_records(records: Sequence[CommitRecord], snap: TableSnapshot, rule: SnapshotFilter) -> list[CommitRecord]:
    """The records whose changes the snapshot may not hold (see the module docstring)."""
    out: list[CommitRecord] = []
    for r in records:
        if r.xid_min is None:
            if int(r.end_lsn) <= snap.plan_lsn:
                continue  # written before the snapshot began: its changes are in the snapshot's rows
            raise SinkError(
                f"{snap.qualified}: batch {r.name or r.end} (ending at {r.end}) was written without full transaction "
                f"ids, after snapshot {snap.snapshot_id} began ({Lsn(snap.plan_lsn)}), so it cannot be merged with it",
                RESNAPSHOT_FIX,
            )
        if r.xid_max is not None and rule.all_visible(int(r.xid_max)):
            continue
        out.append(r)
    return out


def state_ddl(columns: Sequence[StateColumn]) -> str:
    """A state frame's schema as Spark DDL."""
    own = [f"{quote(c.name)} {spark_ddl(c.type)}" for c in columns]
    return ", ".join([*own, "`_untyped` map<string,string>", "`_commit_lsn` bigint", "`_commit_ts` timestamp"])


def base_frame(spark: Any, snap: TableSnapshot, described: TableSchema, columns: Sequence[StateColumn],
               read: Any = None) -> Any:
    """The snapshot's rows as a state frame (no commit position: older than every change); ``read(files)``
    reads Parquet files into a frame with schemas merged (default: Spark's reader)."""
    return _rows(spark, snap.files, snap, described, columns, read)


def _rows(spark: Any, files: Sequence[str], snap: TableSnapshot, described: TableSchema,
          columns: Sequence[StateColumn], read: Any = None) -> Any:
    from pyspark.sql import functions as F

    if not files:
        return spark.createDataFrame([], state_ddl(columns))
    rows = read(files) if read is not None else spark.read.option("mergeSchema", "true").parquet(*files)
    have = set(rows.columns)
    physical = {c.name: c.physical for c in snap.columns}
    picked = []
    for d, c in zip(described.columns, columns, strict=True):
        src = physical.get(d.name)
        ddl = spark_ddl(c.type)
        value = F.col(quote(src)).cast(ddl) if src is not None and src in have else F.lit(None).cast(ddl)
        picked.append(value.alias(c.name))
    untyped = F.col("_untyped") if "_untyped" in have else F.lit(None).cast("map<string,string>")
    return rows.select(*picked, untyped.alias("_untyped"), F.lit(None).cast("bigint").alias("_commit_lsn"),
                       F.lit(None).cast("timestamp").alias("_commit_ts"))


def recheck_rows(spark: Any, snap: TableSnapshot, described: TableSchema, columns: Sequence[StateColumn],
                 high_water: Lsn | None, read: Any = None) -> RecheckRows | None:
    """The snapshot's recheck rows (:mod:`pgpoll.materialize.recheck_fill`), once the change log has passed its
    convergence LSN (every transaction a recheck saw is then in it); None when there are none or not yet.
    ``read(files)``: as for :func:`base_frame`."""
    from pyspark.sql import functions as F

    if not snap.rechecks or not converged(snap, high_water):
        return None
    frame = None
    for i, piece in enumerate(snap.rechecks):
        part = _rows(spark, piece.files, snap, described, columns, read).withColumn("__pgpoll_r", F.lit(i))
        frame = part if frame is None else frame.unionByName(part)
    return RecheckRows(frame, tuple(p.snapshot for p in snap.rechecks))


def converged(snap: TableSnapshot | None, high_water: Lsn | None) -> bool:
    """Whether the change log has passed the snapshot's convergence LSN."""
    return (snap is not None and high_water is not None and snap.convergence_lsn is not None
            and int(high_water) >= snap.convergence_lsn)


def snapshot_json(snap: TableSnapshot | None, high_water: Lsn | None) -> dict[str, Any] | None:
    """``"snapshot"`` of ``materialize --json``: converged once the change log passed the convergence LSN."""
    if snap is None:
        return None
    return {"id": snap.snapshot_id, "complete": True, "converged": converged(snap, high_water)}


def predates_warning(events: Any, key: Mapping[str, str], qualified: str) -> str | None:
    """A warning when an UPDATE or DELETE touches a key no change in ``events`` created (``key``: name -> physical).

    Only a snapshot can bring such rows (they predate the slot); one anti-join, done on full builds only.
    """
    from pyspark.sql import functions as F

    if events is None or not key:
        return None
    before = {f.name for f in events.schema["_before"].dataType.fields} if "_before" in events.columns else set()
    have = set(events.columns)
    if any(p not in have for p in key.values()):
        return None
    new = F.struct(*[F.col(quote(p)).alias(f"k{i}") for i, p in enumerate(key.values())])
    old = F.struct(*[(F.coalesce(F.col(f"_before.{quote(p)}"), F.col(quote(p))) if p in before else F.col(quote(p)))
                     .alias(f"k{i}") for i, p in enumerate(key.values())])
    # rows the log created: INSERTs, and UPDATEs that moved a row to a new key
    created = events.where((F.col("_op") == "I") | ((F.col("_op") == "U") & ~old.eqNullSafe(new))).select(new.alias("k"))
    touched = events.where(F.col("_op").isin("U", "D")).select(old.alias("k"))
    if touched.join(created, "k", "left_anti").limit(1).count() == 0:
        return None
    return predates_text(qualified)


def predates_text(qualified: str) -> str:
    """The warning for a table whose changes touch rows that predate the captured history."""
    return (f"{qualified} has UPDATEs or DELETEs of rows that predate the captured history and no snapshot: "
            f"its state lacks the rows the slot never saw; fix: run {resnapshot_command(qualified)}")


def added_columns_warning(earlier: TableSchema | None, latest: TableSchema, qualified: str) -> str | None:
    """A warning when ``latest`` has columns ``earlier`` (the snapshot's or the previous state's shape) lacks.

    PostgreSQL writes no row change for ``ADD COLUMN ... DEFAULT``: rows stored
    before it read the default, while their state rows hold null there.
    """
    if earlier is None:
        return None
    added = [n for n in latest.names if earlier.column(n) is None]
    if not added:
        return None
    return (f"{qualified}: column(s) {', '.join(added)} were added after rows of the state were last changed; those rows "
            "hold null there where the source may hold the column's default; fix: run "
            f"{resnapshot_command(qualified)}")
