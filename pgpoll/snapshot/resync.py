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
exists, there is nothing left to do. Only a slot *past* the output is
resynced here: a slot on another database system or on a timeline that left
the output's before its mark means the output holds changes the server never
had, which a marker cannot take back (the fix then names a new output).
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
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.head import output_head
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import GAP, GAP_VERSION, CommitRecord
from pgpoll.sink.snapshot_store import complete_snapshots
from pgpoll.sink.stores.filesystem import OutputFs, check_writable, open_output
from pgpoll.snapshot.run import SnapshotOptions, run_snapshot
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.control import ControlConnection
from pgpoll.source.names import check_slot_name
from pgpoll.source.server_identity import ServerIdentity, read_identity, read_timeline_history
from pgpoll.source.slot_gap import SLOT_AHEAD, TIMELINE_UNVERIFIED, OutputHead, check_slot_gap
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

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.__dict__, sort_keys=True)


def _gap_json(record: CommitRecord) -> dict[str, Any]:
    return {"seq": record.seq, "start": record.start, "end": record.end, "resume": record.resume}


def newest_gap(fs: OutputFs) -> CommitRecord | None:
    """The newest gap record of the output's commit log (every record read: resync is rare)."""
    return next((r for r in reversed(CommitLog(fs).records()) if r.is_gap), None)


def _covered(fs: OutputFs, gap: CommitRecord) -> bool:
    """Whether the newest complete snapshot was planned after ``gap``'s resume point."""
    done = complete_snapshots(fs)
    return bool(done) and gap.resume is not None and int(done[0][1].get("plan_lsn_int", 0)) >= int(Lsn.parse(gap.resume))


def mark_gap(control: ControlConnection, fs: OutputFs, slot: str, output: str, run: str) -> CommitRecord | None:
    """Write the gap record if the slot is past the output (None: no gap, or already marked); see the module doc."""
    commit_log = CommitLog(fs)

    def head() -> OutputHead:
        hwm, record = output_head(commit_log)
        return OutputHead(hwm, ServerIdentity.from_json(record.server) if record is not None else None)

    verdict = check_slot_gap(control.slot_info, head, output_path=output, identity=lambda: control.call(read_identity),
                             history=lambda t: control.call(lambda c: read_timeline_history(c, t)))
    if verdict.error is None:
        return None
    if verdict.position == TIMELINE_UNVERIFIED:
        raise verdict.error  # the timeline history needs a grant: nothing to judge with
    if verdict.position != SLOT_AHEAD:
        raise SlotGapError(verdict.error.message,
                           "resync cannot take back changes the server never had: stop ingesting into this output, "
                           "then snapshot into a new output (see "
                           "docs/how-to/lost-slot.md#a-lost-slot-another-server-a-diverged-timeline)",
                           lsn=verdict.error.lsn)
    state = commit_log.state()
    seq = state.head + 1
    hwm = state.high_water_mark
    record = CommitRecord(
        start=str(verdict.output.high_water_mark), end=str(hwm), rows=0, files=[], partition=None, slot=slot,
        plugin=verdict.slot.plugin or "", version=GAP_VERSION, seq=seq, prev=state.prev_of(seq), kind=GAP, run=run,
        server=verdict.server.as_json(), resume=str(verdict.slot.confirmed_flush_lsn),
    )
    if not commit_log.create(record):
        raise FenceLostError(f"another run published commit-log record {seq} while the gap was being marked",
                             "rerun pgpoll resync once the other run is done")
    log.warning("gap marked in %s: the changes in (%s, %s] are not in the output", output, record.start, record.resume)
    return record


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
        try:
            marked = mark_gap(control, fs, opts.slot, opts.output, run)
        finally:
            lease.release()
    finally:
        control.close()
    gap = marked or newest_gap(fs)
    summary.marked = marked is not None
    summary.gap = _gap_json(gap) if gap is not None else None
    if gap is None:
        summary.notes.append("the slot and the output agree and no gap is on record: nothing to resync")
    elif not marked and _covered(fs, gap):
        summary.notes.append(f"a complete snapshot planned after the gap at record {gap.seq} exists: nothing to do")
    else:
        snap = run_snapshot(replace(opts), spark=spark, stop=stop, show_progress=show_progress)
        summary.snapshot = json.loads(snap.to_json())
        summary.status, summary.exit_code = snap.status, snap.exit_code
    summary.seconds = round(time.monotonic() - started, 3)
    return summary
