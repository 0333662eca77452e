"""``pgpoll resync``: put a gap on record in the output's commit log, then snapshot every captured table into it.

After a slot was moved past the output (dropped and recreated, consumed by
another reader, advanced by hand: :mod:`pgpoll.source.slot_gap`), the changes
in between are gone from it for good. The same output can go on:

1. **The gap marker first**, under the output's ingest lease (a running
   ingest makes this exit 3) and through the commit log's fence: a record of
   kind ``gap`` (format 3: a pgpoll that does not know gaps refuses the output
   rather than read it as an empty batch) saying the output lacks the changes
   in ``(start, resume]``, ``resume`` being the slot's position. It does not
   move the high-water mark (its ``end`` is the mark it was written on), but
   the gap check takes ``resume`` as the output's position, so ``ingest`` can
   run again at once and goes on from the slot.
2. **Then a snapshot of every captured table** (:func:`pgpoll.snapshot.run.run_snapshot`,
   the chunked snapshot: planned after the marker, so after the slot's new
   position). Materialize builds no table across the gap but on a snapshot
   planned after it (:mod:`pgpoll.materialize.run`), so until this step is
   complete ``materialize`` refuses, naming the fix, rather than build a
   state that misses the gap's changes.

Idempotent and resumable: a rerun finds the gap already marked (the slot is
at the marker's ``resume``, or an ingest went on from it) and resumes the
snapshot the way ``pgpoll snapshot`` does (the same arguments continue the
incomplete one); once a complete snapshot planned after the newest gap
exists, there is nothing left to do.

A slot on another database system, or on a timeline that left the output's
before its mark (an unsafe failover), is resynced too, with more steps:
the output holds changes the server never had and lacks the server's own
up to the mark; :mod:`pgpoll.snapshot.resync_history` brings the server's WAL
past the mark, makes sure every transaction the slot will skip is visible
to the snapshot, and marks the gap so that materialize rebuilds every state
from this server. Only a timeline the role cannot verify (the history file
needs a grant) is refused.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pgpoll.errors import ConfigError, FenceLostError, SlotGapError
from pgpoll.sink.commit.head import output_head
from pgpoll.sink.commit.lease import Lease, LeaseKeeper
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import GAP, GAP_VERSION, CommitRecord
from pgpoll.sink.snapshot_store import complete_snapshots
from pgpoll.sink.stores.filesystem import OutputFs, check_writable, open_output
from pgpoll.snapshot import resync_history
from pgpoll.snapshot.run import SnapshotOptions, run_snapshot
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.control import ControlConnection
from pgpoll.source.names import check_slot_name
from pgpoll.source.server_identity import ServerIdentity, read_identity, read_timeline_history
from pgpoll.source.slot_gap import OTHER_SERVER, SLOT_AHEAD, TIMELINE_DIVERGED, OutputHead, check_slot_gap
from pgpoll.stopping import StopRequest

log = logging.getLogger("pgpoll.resync")


@dataclass
class ResyncSummary:
    """The JSON line ``pgpoll resync`` prints: the gap it marked (or found marked) and the snapshot's summary."""

    slot: str
    gap: dict[str, Any] | None = None
    marked: bool = False
    snapshot: dict[str, Any] | None = None
    seconds: float = 0.0
    status: str = "ok"
    exit_code: int = 0
    notes: list[str] = field(default_factory=list)
    #: a server whose history left the output's (resync_history.NewHistory.as_json), None otherwise
    history: dict[str, Any] | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.__dict__, sort_keys=True)


def _gap_json(record: CommitRecord) -> dict[str, Any]:
    return {"seq": record.seq, "start": record.start, "end": record.end, "resume": record.resume,
            "reason": record.reason}


def newest_gap(fs: OutputFs) -> CommitRecord | None:
    """The newest gap record of the output's commit log (every record read: resync is rare)."""
    return next((r for r in reversed(CommitLog(fs).records()) if r.is_gap), None)


def _covered(fs: OutputFs, gap: CommitRecord) -> bool:
    """Whether the newest complete snapshot was planned after ``gap``'s resume point (on its server, for a gap of a
    new history: :meth:`CommitRecord.covered_by`)."""
    done = complete_snapshots(fs)
    return bool(done) and gap.resume is not None and gap.covered_by(int(done[0][1].get("plan_lsn_int", 0)),
                                                                    done[0][1].get("server"))


@dataclass
class Marked:
    """What :func:`mark_gap` wrote: the gap record, and for a new history what its proof needs."""

    record: CommitRecord
    history: resync_history.NewHistory | None = None


def mark_gap(control: ControlConnection, fs: OutputFs, opts: SnapshotOptions, run: str) -> Marked | None:
    """Write the gap record if the slot cannot go on feeding the output as it is (None: no gap, or already marked).

    A slot past the output: the record at once (module docstring). Another
    system or a diverged timeline: :func:`resync_history.prepare` first, then
    the record, then the slot advanced to its ``resume``. A timeline that
    cannot be verified raises its error.
    """
    commit_log = CommitLog(fs)

    def head() -> OutputHead:
        hwm, record = output_head(commit_log)
        return OutputHead(hwm, ServerIdentity.from_json(record.server) if record is not None else None)

    verdict = check_slot_gap(control.slot_info, head, output_path=opts.output,
                             identity=lambda: control.call(read_identity),
                             history=lambda t: control.call(lambda c: read_timeline_history(c, t)))
    if verdict.error is None:
        return None
    if verdict.position not in (SLOT_AHEAD, TIMELINE_DIVERGED, OTHER_SERVER):
        raise verdict.error  # timeline_unverified: the timeline history needs a grant, nothing to judge with
    history = None
    start, resume = str(verdict.output.high_water_mark), str(verdict.slot.confirmed_flush_lsn)
    if verdict.position != SLOT_AHEAD:
        history = resync_history.prepare(control, verdict, opts.publications, opts.wait_timeout_s)
        start, resume = str(history.start), str(history.resume)
    state = commit_log.state()
    seq = state.head + 1
    record = CommitRecord(
        start=start, end=str(state.high_water_mark), rows=0, files=[], partition=None, slot=opts.slot,
        plugin=verdict.slot.plugin or "", version=GAP_VERSION, seq=seq, prev=state.prev_of(seq), kind=GAP, run=run,
        server=verdict.server.as_json(), resume=resume, reason=verdict.position,
    )
    if not commit_log.create(record):
        raise FenceLostError(f"another run published commit-log record {seq} while the gap was being marked",
                             "rerun pgpoll resync once the other run is done")
    if history is not None:
        control.advance(history.resume)  # watched: a failover slot's advance can wait on its standbys
        log.warning("gap marked in %s: the output holds changes in (%s, %s] this server never had and lacks the "
                    "server's up to %s; the slot goes on from %s", opts.output, record.start, record.end, resume, resume)
    else:
        log.warning("gap marked in %s: the changes in (%s, %s] are not in the output", opts.output, record.start,
                    record.resume)
    return Marked(record, history)


def _proved_snapshot(opts: SnapshotOptions, spark: Any, stop: StopRequest | None,
                     show_progress: Callable[[str], None] | None, fs: OutputFs,
                     history: resync_history.NewHistory | None) -> Any:
    """The snapshot; for a new history, taken again (once) if a chunk missed a transaction the slot skips."""
    snap = run_snapshot(replace(opts), spark=spark, stop=stop, show_progress=show_progress)
    if history is None or snap.exit_code != 0 or snap.snapshot_id is None:
        return snap
    missed = resync_history.invisible(fs, snap.snapshot_id, history.xids)
    if not missed:
        return snap
    log.warning("snapshot %s did not see %d transaction(s) committed below %s: taking a new one", snap.snapshot_id,
                len(missed), history.resume)
    snap = run_snapshot(replace(opts), spark=spark, stop=stop, show_progress=show_progress)
    if snap.exit_code == 0 and snap.snapshot_id is not None and resync_history.invisible(fs, snap.snapshot_id, missed):
        raise SlotGapError(f"snapshot {snap.snapshot_id} does not see every transaction committed below "
                           f"{history.resume}", "rerun pgpoll resync: it takes a new snapshot")
    return snap


def run_resync(opts: SnapshotOptions, spark: Any = None, stop: StopRequest | None = None,
               show_progress: Callable[[str], None] | None = None) -> ResyncSummary:
    """Mark the gap, then snapshot every captured table (``opts.tables`` and row filters as ``snapshot`` takes)."""
    started = time.monotonic()
    check_slot_name(opts.slot)
    summary = ResyncSummary(slot=opts.slot)
    fs = open_output(opts.output)
    check_writable(fs)
    run = uuid.uuid4().hex
    control = ControlConnection(resolve_dsn(opts.dsn), opts.slot)
    control.open()
    try:
        if control.slot_info().plugin == "pgoutput" and not opts.publications:  # before the marker, not after it
            raise ConfigError(f'slot "{opts.slot}" uses pgoutput: resync snapshots its publications\' tables',
                              "pass --publication NAME")
        lease = Lease(fs, run=run, slot=opts.slot)
        lease.acquire()  # no ingest while the marker is written (exit 3 at once)
        keeper = LeaseKeeper(lease)  # a new history's preparation can outlast the lease's TTL
        try:
            marked = mark_gap(control, fs, opts, run)
        finally:
            keeper.stop()
            lease.release()
    finally:
        control.close()
    gap = marked.record if marked is not None else newest_gap(fs)
    history = marked.history if marked is not None else None
    summary.marked = marked is not None
    summary.gap = _gap_json(gap) if gap is not None else None
    summary.history = history.as_json() if history is not None else None
    if gap is None:
        summary.notes.append("the slot and the output agree and no gap is on record: nothing to resync")
    elif not marked and _covered(fs, gap):
        summary.notes.append(f"a complete snapshot planned after the gap at record {gap.seq} exists: nothing to do")
    else:
        snap = _proved_snapshot(opts, spark, stop, show_progress, fs, history)
        summary.snapshot = json.loads(snap.to_json())
        summary.status, summary.exit_code = snap.status, snap.exit_code
    summary.seconds = round(time.monotonic() - started, 3)
    return summary
