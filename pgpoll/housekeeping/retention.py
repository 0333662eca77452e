"""``pgpoll retain``: remove change-log batches older than a retention, never one that something still needs.

What may go is :mod:`pgpoll.housekeeping.retention_plan`'s answer. Carrying
it out is ordered so that a run killed at any point leaves an output every
reader still reads correctly, and the next run finishes the work:

1. the light recovery ingest runs before each batch, and the change table's
   Delta log completed (:meth:`pgpoll.sink.commit.batches.BatchSink.recover`):
   every record removed must already be in that log, or a later sync would
   add its files back; so must every compaction record (its Delta version
   applied late would add a merged file back, or remove files twice); then a checkpoint of every record up to the head
   (:func:`fold_all`), so that start-up never needs a removed record;
2. the retention floor is written (:mod:`pgpoll.sink.commit.floor`, not
   done): from here on start-up, materialize and the readers know records up
   to it are gone on purpose;
3. one Delta version of ``remove`` actions (``dataChange`` true, written by
   delta-rs's partition delete) over every removed partition: the table's
   readers stop listing the files before they disappear. Spark structured
   streaming readers of ``changes/`` must set ``ignoreDeletes`` (or
   ``skipChangeCommits``), or they stop at this version;
4. the partitions under ``changes/`` and ``tables/<dir>/`` (with those of
   ``pgpoll compact``'s merges wholly below the floor, and what they
   replaced; a merge the floor would cut is kept whole, the floor lowered
   before it: :mod:`pgpoll.housekeeping.retention_plan`), then the
   records (gap records stay: they carry no files and materialize reads the
   newest by number);
5. the floor marked done; superseded complete snapshots deleted (data first,
   then their chunk manifests, ``complete.json`` and the plan: a half-deleted
   one is never taken for a complete snapshot).

One run per output at a time: a lease of its own
(``_pgpoll/leases/retain.json``, exit 3 when held), and never beside
``pgpoll compact``: it holds the compaction lease too (exit 3 while a
compaction runs: :mod:`pgpoll.housekeeping.leases`). Ingest and materialize
run beside it: retention never touches the records after the checkpoint it
wrote, and a materialize run registers its destination before it reads
the log (:mod:`pgpoll.sink.destinations`).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pgpoll.errors import SinkError, first_line
from pgpoll.housekeeping.leases import OtherLease, compaction_lease, retention_lease
from pgpoll.housekeeping.retention_plan import RetentionPlan, plan_retention, summary
from pgpoll.sink import destinations, layout
from pgpoll.sink.change_table import ChangeTable
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.compactions import CompactionLog, Merge, load_map
from pgpoll.sink.commit.floor import RetentionFloor, merge_removed, read_floor, write_floor
from pgpoll.sink.commit.lease import LeaseKeeper
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.commit.records import utc_now
from pgpoll.sink.stores.filesystem import check_writable, open_output
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.housekeeping")

RETAIN_LEASE = layout.RETAIN_LEASE


def run_retain(output: str, retention: timedelta, *, dry_run: bool = False, now: datetime | None = None,
               fs: OutputFs | None = None) -> dict[str, Any]:
    """One ``pgpoll retain`` run over ``output`` (see the module docstring); returns its summary."""
    fs = fs or open_output(output)
    now = now or datetime.now(UTC)
    run = uuid.uuid4().hex[:12]
    if dry_run:
        out = summary(plan_retention(fs, retention, now))
        return {**out, "dry_run": True, "finished": 0, "deferred": []}
    check_writable(fs)
    lease = retention_lease(fs, run)
    lease.acquire()
    keeper = LeaseKeeper(lease)
    try:
        with OtherLease(compaction_lease(fs, run)) as other:
            return _retain(fs, output, retention, now, run, keeper, other)
    finally:
        keeper.stop()
        lease.release()


def _retain(fs: OutputFs, output: str, retention: timedelta, now: datetime, run: str, keeper: LeaseKeeper,
            other: OtherLease) -> dict[str, Any]:
    """The run, both housekeeping leases held."""
    finished, late = finish_unfinished(fs)
    if late:  # a killed or deferred run's floor: its removal waits for the materialize runs that saw an older one
        out = summary(plan_retention(fs, retention, now, folded=0))
        return {**out, "dry_run": False, "finished": 0, "deferred": late}
    folded = fold_all(fs, output, run)
    plan = plan_retention(fs, retention, now, folded)
    out = summary(plan)
    keeper.check()  # still ours, and no compaction came in, before the floor rises
    other.check()
    if plan.records or plan.floor > plan.start:
        late = carry_out(fs, plan, run)
        if late:
            return {**out, "dry_run": False, "finished": finished, "deferred": late}
    elif left := [m for m in plan.merges if fs.exists(fs.path(layout.CHANGES, m.partition))]:
        remove_records(fs, [], plan.floor, left)  # merges still there below the floor (a run killed midway)
    keeper.check()
    other.check()
    for sid in plan.snapshots:
        remove_snapshot(fs, sid)
    return {**out, "dry_run": False, "finished": finished, "deferred": []}


def fold_all(fs: OutputFs, output: str, run: str) -> int:
    """Recovery, the change table completed, then a checkpoint of every record up to the head (unless the newest
    folds them already): the checkpoint start-up reads then folds every record retention may remove."""
    sink = BatchSink(None, output, fs=fs, run=run)
    sink.recover(full=False)  # every record up to the head has its files in place, and is in the Delta log
    state = sink.log.last_state or sink.log.state()
    if state.head > 0 and (state.checkpoint is None or state.checkpoint.seq < state.head):
        sink.log.write_checkpoint(state, state.head, run)
    apply_compactions(fs)
    return state.head


def late_builders(fs: OutputFs, floor: int) -> list[str]:
    """Destinations whose materialize run is under way and began before the floor reached ``floor``.

    Such a run read the floor before it rose, so it may still read records at or below ``floor``: their files
    stay until it ends. A run that registers after the floor is written reads the new floor (materialize
    registers before it reads the floor), so it does not count. A run that died holds the removal until that
    destination's next run, as it holds retention (:mod:`pgpoll.housekeeping.retention_plan`).
    """
    return [d.name for d in destinations.registered(fs)
            if d.building is not None and int(d.building.get("floor", 0)) < floor]


def apply_compactions(fs: OutputFs) -> None:
    """Every compaction record in the change table's Delta log, in order (as ``pgpoll compact`` adds them): the
    removes that follow then see every merged file, and no compaction version comes after them."""
    table = ChangeTable(fs)
    compactions = CompactionLog(fs)
    head = compactions.head()
    if not table.enabled or not head:
        return
    for seq in range(table.compacted() + 1, head + 1):
        table.apply_compaction(compactions.read(seq))


def carry_out(fs: OutputFs, plan: RetentionPlan, run: str) -> list[str]:
    """Raise the floor to ``plan.floor``, then remove its records' files and the records (see the module docstring).

    Returns the destinations whose materialize run began before the floor rose (:func:`late_builders`, read after
    the floor is written): then nothing is removed yet, and a later run finishes the removal once they have ended.
    """
    before = plan.floor_before
    tables: dict[str, list[Any]] = {k: list(v) for k, v in (before.tables if before is not None else {}).items()}
    data_seq = before.data_seq if before is not None else 0
    for r in plan.records:
        for t in r.tables:
            merge_removed(tables, t, r.seq, r.end, r.xid_max, r.xid_min is not None)
        if r.partition:
            data_seq = r.seq
    assert plan.end is not None
    floor = RetentionFloor(seq=plan.floor, end=plan.end, start=plan.start + 1, tables=tables, data_seq=data_seq, run=run)
    write_floor(fs, floor)
    late = late_builders(fs, floor.seq)
    if late:
        log.warning("retention: the floor is now commit-log record %d; its batches are removed by a later "
                    "pgpoll retain, once the materialize run(s) of %s that started before it have ended",
                    floor.seq, ", ".join(late))
        return late
    remove_records(fs, plan.records, floor.seq, plan.merges)
    write_floor(fs, replace(floor, done=True, written_at=utc_now()))
    log.info("retention: %d batch(es) removed, the floor is commit-log record %d (%s)", len(plan.records), floor.seq,
             floor.end)
    return []


def finish_unfinished(fs: OutputFs) -> tuple[int, list[str]]:
    """Remove what a killed (or deferred) run left of the records below its floor.

    Returns how many records were left, and the destinations still building on an older floor (then nothing is
    removed: :func:`late_builders`).
    """
    floor = read_floor(fs)
    if floor is None or floor.done:
        return 0, []
    late = late_builders(fs, floor.seq)
    if late:
        log.warning("retention: the removal below the floor %d waits for the materialize run(s) of %s",
                    floor.seq, ", ".join(late))
        return 0, late
    commit_log = CommitLog(fs)
    left = [commit_log.read(seq) for seq in range(floor.start, floor.seq + 1) if fs.exists(commit_log.record_path(seq))]
    left = [r for r in left if not r.is_gap]
    if left:
        log.warning("retention: finishing the removal of %d batch(es) below the floor %d (a run stopped midway)",
                    len(left), floor.seq)
    remove_records(fs, left, floor.seq, [m for m in load_map(fs).merges if m.last <= floor.seq])
    write_floor(fs, replace(floor, done=True, written_at=utc_now()))
    return len(left), []


def remove_records(fs: OutputFs, records: list[CommitRecord], floor: int, merges: list[Merge]) -> None:
    """The Delta log's removes, the partitions, then the records (each step idempotent).

    The partitions are the records' own (compaction may have deleted them already), and those of ``merges`` (wholly
    at or below the floor) with the ones they replaced: every name sorts at or below the floor's end, and every
    partition kept above it (a merge is never cut) after it, so one Delta predicate removes exactly them.
    """
    partitions = [(r.partition, list(r.tables)) for r in records if r.partition]
    for merge in merges:
        partitions += [(merge.partition, sorted(merge.tables)), *((str(p), list(t)) for p, t in merge.sources)]
    if partitions:
        remove_from_delta(fs, max(p for p, _t in partitions), floor)
    commit_log = CommitLog(fs)
    for partition, tables in partitions:
        for t in tables:
            fs.delete(fs.path(layout.TABLES, t, partition))
        fs.delete(fs.path(layout.CHANGES, partition))
    for r in records:
        fs.delete(commit_log.record_path(r.seq))


def remove_from_delta(fs: OutputFs, last: str, floor: int) -> None:
    """One Delta version removing every file of partitions up to ``last`` (names sort by LSN; the partitions after
    the floor start above it); nothing when there are none (a rerun)."""
    table = ChangeTable(fs)
    if not table.enabled:
        return
    loaded = table._load()
    if loaded is None:
        return
    from deltalake.transaction import CommitProperties

    value = last.split("=", 1)[1]
    properties = CommitProperties(custom_metadata={"pgpoll": json.dumps({"retention_floor": floor})})
    try:
        loaded.delete(f"lsn_range <= '{value}'", commit_properties=properties)
    except Exception as exc:
        raise SinkError(f"cannot remove the retained batches from the change log's Delta table {table.uri}: "
                        f"{first_line(exc)}", "rerun pgpoll retain: it finishes the removal") from None


def remove_snapshot(fs: OutputFs, snapshot_id: str) -> None:
    """Delete a superseded snapshot: its rows, its chunk manifests, ``complete.json``, then its plan (a run killed
    midway never leaves a snapshot that says it is complete without its plan or rows)."""
    fs.delete(fs.path(layout.SNAPSHOTS, snapshot_id))
    meta = fs.path(layout.SNAPSHOT_META, snapshot_id)
    for name, _is_dir, _size in fs.list(meta):
        if name not in (layout.SNAPSHOT_COMPLETE, layout.SNAPSHOT_PLAN):
            fs.delete(f"{meta}/{name}")
    fs.delete(f"{meta}/{layout.SNAPSHOT_COMPLETE}")
    fs.delete(meta)
    log.info("retention: superseded snapshot %s removed", snapshot_id)
