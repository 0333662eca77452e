"""What ``pgpoll retain`` may remove: the new retention floor, and what holds it back.

Records are removed from the oldest up to a floor, never past:

* the retention age: a record committed after ``now - retention`` stays
  (found by a search over record numbers: ``committed_at`` grows with ``seq``);
* the newest record (the head): the run first writes a checkpoint of every
  record (:func:`pgpoll.housekeeping.retention.fold_all`), so start-up, which
  reads the newest checkpoint and probes the records after it
  (:mod:`pgpoll.sink.commit.log`), never needs a removed record;
* a registered destination (:mod:`pgpoll.sink.destinations`): the records
  past the smallest position of its tables, or, while a run of it is
  ``building``, past the floor that run saw. A destination that holds
  retention back is named in a warning, with the two ways on (run it, or
  unregister it);
* the changes each table's newest complete snapshot needs to be rebuilt:
  the first record naming the table that ``materialize`` would read on top of
  that snapshot (a transaction not visible to every chunk: below the plan
  position by LSN but still in progress for the snapshot, such as a commit
  waiting on a synchronous standby, counts). The rule is materialize's own
  (:func:`needed_by`), so what retention keeps is exactly what a rebuild reads.

* a merge of ``pgpoll compact`` (:mod:`pgpoll.sink.commit.compactions`) the
  floor would cut: the floor is lowered to the record before the merge's
  first, so the whole merge stays (retention never rewrites a merge: one of
  128 MB can hold days of small batches, and it goes whole once its last
  record is old enough). Merges wholly at or below the floor go with their
  records: their partitions under ``changes/`` and ``tables/`` and the ones
  they replaced (``merges``).

A table with removed batches and no complete snapshot cannot be rebuilt by
a new destination or ``materialize --full`` afterwards: the plan says so in a
warning naming the snapshot that would make it rebuildable. Snapshots all of
whose tables a newer complete snapshot holds are superseded and listed for
removal. The plan reads the records it would remove (their files are what
goes), plus a few by number for the searches; nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pgpoll.errors import ConfigError
from pgpoll.sink import destinations, layout
from pgpoll.sink.commit.compactions import Merge, load_map
from pgpoll.sink.commit.floor import RetentionFloor, read_floor
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.commit.records import parse_timestamp
from pgpoll.sink.snapshot_store import complete_snapshots
from pgpoll.sink.stores.output_fs import OutputFs
from pgpoll.xids import Snapshot


@dataclass(frozen=True)
class SnapshotNeed:
    """What one table's newest complete snapshot needs of the change log: materialize's record rule."""

    snapshot_id: str
    table: str
    plan_lsn: int
    min_xmin: int | None  # None: no chunk (every record with ids is needed)

    def needs(self, record: CommitRecord) -> bool:
        """Whether materialize, rebuilding the table on this snapshot, reads ``record``
        (:func:`pgpoll.materialize.snapshot_merge.select_records`, the same rule)."""
        if record.xid_min is None:
            return int(record.end_lsn) > self.plan_lsn
        return not (record.xid_max is not None and self.min_xmin is not None and int(record.xid_max) < self.min_xmin)


@dataclass(frozen=True)
class Hold:
    """Something that keeps records past ``seq``: ``what`` names it; ``warn`` when it stops retention short of
    the age (a destination behind, a building run that died)."""

    seq: int
    what: str
    warn: bool = False


@dataclass
class RetentionPlan:
    """The new floor and what goes with it (see the module docstring)."""

    floor_before: RetentionFloor | None
    floor: int
    end: str | None
    records: list[CommitRecord] = field(default_factory=list)
    """The records to remove (not gap records: they stay), oldest first."""
    holds: list[Hold] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    """Superseded complete snapshots to remove."""
    aged: int = 0
    """The floor the age alone would allow."""
    merges: list[Merge] = field(default_factory=list)
    """``pgpoll compact``'s merges wholly at or below the floor: removed with the records they hold."""

    @property
    def start(self) -> int:
        return self.floor_before.seq if self.floor_before is not None else 0

    @property
    def stopped_by(self) -> Hold | None:
        """The hold that set the floor below the age's (None: the age did)."""
        return min(self.holds, key=lambda h: h.seq) if self.holds and min(h.seq for h in self.holds) < self.aged else None


def _search(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The largest ``seq`` in ``lo..hi`` with ``ok`` (``ok`` true up to a point, then false; ``lo`` when none)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def snapshot_needs(fs: OutputFs) -> tuple[dict[str, SnapshotNeed], list[str]]:
    """Each table directory's newest complete snapshot need, and the superseded complete snapshots (oldest first)."""
    needs: dict[str, SnapshotNeed] = {}
    superseded: list[str] = []
    for store, plan, _done in complete_snapshots(fs):  # newest first
        fresh = False
        for t in plan.get("tables", ()):
            directory = str(t["dir"])
            if directory in needs:
                continue
            fresh = True
            xmins = [Snapshot.from_json(m["snapshot"]).xmin for m in store.manifests(directory).values() if "snapshot" in m]
            needs[directory] = SnapshotNeed(store.snapshot_id, f"{t['schema']}.{t['table']}",
                                            int(plan.get("plan_lsn_int", 0)), min(xmins) if xmins else None)
        if not fresh:
            superseded.append(store.snapshot_id)
    return needs, sorted(superseded)


def plan_retention(fs: OutputFs, retention: timedelta, now: datetime, folded: int | None = None) -> RetentionPlan:
    """The plan of one ``pgpoll retain`` run (see the module docstring).

    ``folded``: the head the run's checkpoint folded (:func:`pgpoll.housekeeping.retention.fold_all`). Records
    ingest published after it are never removed: start-up and the change table's Delta log may not have them yet.
    """
    log = CommitLog(fs)
    state = log.state()
    if state.v1_names or (state.checkpoint is not None and state.checkpoint.v1_records != 0):
        raise ConfigError(f"{fs.root} holds commit-log records of format 1 (written by pgpoll before 0.2)",
                          "retention works on outputs written by pgpoll 0.2 or newer only: start a new output")
    before = read_floor(fs)
    start = before.seq if before is not None else 0
    cap = state.head - 1  # the head stays; the run folds every record into a checkpoint first (retention.py)
    if folded is not None:
        cap = min(cap, folded)  # and no record published since that checkpoint
    needs, superseded = snapshot_needs(fs)
    plan = RetentionPlan(floor_before=before, floor=start, end=before.end if before is not None else None,
                         snapshots=superseded)
    if cap <= start:
        _keep_merges_whole(plan, log)  # (merges a raced compaction left below the floor are still removed)
        return plan
    cutoff = now - retention
    plan.aged = _search(start, cap, lambda s: parse_timestamp(log.read(s).committed_at) < cutoff)
    upper = plan.aged
    for dest in destinations.registered(fs):
        hold = _destination_hold(log, dest, start, cap)
        if hold is not None:
            plan.holds.append(hold)
            upper = min(upper, hold.seq)
    unsnapshotted: set[str] = set()
    for seq in range(start + 1, upper + 1):
        record = log.read(seq)
        blocking = next((needs[t] for t in record.tables if t in needs and needs[t].needs(record)), None)
        if blocking is not None:
            plan.holds.append(Hold(seq - 1, f"snapshot {blocking.snapshot_id} of {blocking.table} (its rebuild reads "
                                            f"commit-log record {seq} on)"))
            break
        unsnapshotted.update(t for t in record.tables if t not in needs)
        if not record.is_gap:
            plan.records.append(record)
        plan.floor, plan.end = seq, record.end
    for table in sorted(unsnapshotted):
        parsed = layout.parse_table_dir_name(table)
        name = f"{parsed[0]}.{parsed[1]}" if parsed is not None else table
        plan.warnings.append(f"{name} has no complete snapshot: once its batches up to {plan.end} are removed, a new "
                             f"destination or materialize --full cannot rebuild it (they refuse it, exit 2); fix: "
                             f"pgpoll snapshot --tables {name}")
    _keep_merges_whole(plan, log)
    stop = plan.stopped_by
    if stop is not None and stop.warn:
        plan.warnings.append(stop.what)
    return plan


def _keep_merges_whole(plan: RetentionPlan, log: CommitLog) -> None:
    """Lower ``plan``'s floor below a merge it would cut, and list the merges wholly below it (see the module
    docstring). The map is read after the records: a merge recorded meanwhile covers only older records."""
    compacted = load_map(log.fs)
    cut = next((m for m in compacted.merges if m.first <= plan.floor < m.last), None)
    if cut is not None:
        floor = max(plan.start, cut.first - 1)
        plan.holds.append(Hold(floor, f"pgpoll compact's merge of commit-log records {cut.first}..{cut.last} "
                                      f"({cut.partition}) is kept whole: it goes once record {cut.last} is old enough"))
        plan.records = [r for r in plan.records if r.seq <= floor]
        if floor > plan.start:
            plan.floor, plan.end = floor, log.read(floor).end
        else:
            plan.floor = plan.start
            plan.end = plan.floor_before.end if plan.floor_before is not None else None
    plan.merges = [m for m in compacted.merges if m.last <= plan.floor]


def _destination_hold(log: CommitLog, dest: destinations.Destination, start: int, cap: int) -> Hold | None:
    """How far ``dest`` lets retention go (None: it holds no table and builds nothing: no limit)."""
    limit: int | None = None
    why = ""
    if dest.building is not None:
        limit = int(dest.building.get("floor", 0))
        why = (f"destination {dest.name} has a materialize run that started {dest.building.get('since')} and has not "
               "ended (running, or died): retention holds at the floor it saw")
    position = dest.position()
    if position is not None:
        applied = _search(start, cap, lambda s: log.read(s).end_lsn <= position)
        if limit is None or applied < limit:
            limit = applied
            why = f"destination {dest.name} has applied the batches only up to {position} (updated {dest.updated_at})"
    if limit is None:
        return None
    fix = (f"; fix: materialize it, or, if it is no longer used or no longer builds some of its tables, "
           f"`pgpoll retain --unregister {dest.dest}` (its next run registers the tables it builds)")
    return Hold(max(limit, start), f"retention stops at commit-log record {max(limit, start)}: {why}{fix}", warn=True)


def summary(plan: RetentionPlan) -> dict[str, Any]:
    """The plan as ``pgpoll retain --json`` prints it (before it is carried out)."""
    return {
        "floor_before": plan.start,
        "floor": plan.floor,
        "floor_end": plan.end,
        "batches": len(plan.records),
        "rows": sum(r.rows for r in plan.records),
        "bytes": sum(r.bytes + sum(sum(f.values()) for f in r.table_files.values()) for r in plan.records),
        "partitions": [r.partition for r in plan.records if r.partition],
        "merges": [m.partition for m in plan.merges],
        "snapshots": list(plan.snapshots),
        "held_by": [h.what for h in sorted(plan.holds, key=lambda h: h.seq)],
        "warnings": list(plan.warnings),
    }

