"""``resync`` on a server whose history is not the output's: an unsafe failover, or another database system.

The output holds changes in ``(S, H]`` (S the switch point where the new
primary's timeline left the output's, 0/0 for another system; H the
output's high-water mark) that the server never had, and the server
committed transactions up to H that the output lacks. ``ingest`` can go on
from H only if everything the server committed below H is in a snapshot
that ``materialize`` rebuilds every state from. The argument, step by step
(each step under the output's ingest lease, which a keeper renews; ``ingest``
refuses the slot anyway until the gap record exists):

1. **WAL past H** (:func:`pgpoll.source.new_history.move_wal_past`): a slot
   cannot be advanced, nor a peek bounded, past the server's flushed WAL.
   The resume point R is the larger of H and the slot's position.
2. **The transactions a slot at R skips**: a peek of the slot up to R
   (:func:`~pgpoll.source.new_history.committed_below`) returns every
   transaction whose commit record starts below R and after the slot's
   position; those before the slot's position were finished when the slot
   was created (a new slot's first snapshot waits for every transaction
   running then, ``SnapBuildFindSnapshot``), so their effects are in every
   later snapshot. The ones the peek returns are waited for until a new
   snapshot sees them (:func:`~pgpoll.source.new_history.wait_visible`).
3. **The gap record** (kind ``gap``, ``reason`` the verdict's position,
   ``start`` S, ``end`` H, ``resume`` R, ``server`` the new server): from
   now on ``ingest``, ``status`` and ``check`` accept the slot on the new
   history, and ``materialize`` builds no table across the gap but on a
   snapshot planned at or after R *on that server* (the plan's ``server``,
   :meth:`~pgpoll.sink.commit.records.CommitRecord.covered_by`: a snapshot of
   the old timeline may be planned past R, its positions being reused).
   Then the slot is advanced to R (``ingest`` would do the same).
4. **The snapshot**, planned after step 2's wait: every transaction step 2
   found is visible to each of its chunks. :func:`invisible` checks it
   against the chunks' recorded snapshots (the xmin/xmax/xip materialize's
   visibility merge uses) and the resync takes a new snapshot if one is not.

``materialize`` then rebuilds each table from that snapshot and the records
after the gap (those before it are never read again): rows only the old
timeline had disappear, and the new primary's own rows and changes are there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.sink.snapshot_store import RECHECK_FIRST, SnapshotStore
from pgpoll.sink.stores.filesystem import OutputFs
from pgpoll.source.control import ControlConnection
from pgpoll.source.new_history import committed_below, move_wal_past, wait_visible
from pgpoll.source.slot_gap import Verdict
from pgpoll.source.slots import peek_options
from pgpoll.source.waits import CallWatch
from pgpoll.xids import Snapshot

log = logging.getLogger("pgpoll.resync")


@dataclass(frozen=True)
class NewHistory:
    """What steps 1 and 2 found: where the histories part, where the slot resumes, and what it skips below it."""

    start: Lsn
    resume: Lsn
    xids: tuple[int, ...]
    switches: int

    def as_json(self) -> dict[str, Any]:
        """The resync summary's ``history``."""
        return {"after": str(self.start), "resume": str(self.resume), "wal_switches": self.switches,
                "transactions_below_resume": len(self.xids)}


def prepare(control: ControlConnection, verdict: Verdict, publications: tuple[str, ...],
            wait_timeout_s: float) -> NewHistory:
    """Steps 1 and 2 of the module docstring; nothing is written to the output, the slot does not move."""
    hwm = verdict.output.high_water_mark
    assert hwm is not None  # a verdict of another history has a mark
    slot = verdict.slot
    plugin = slot.plugin or ""
    if plugin == "pgoutput" and not publications:
        raise ConfigError(f'slot "{slot.name}" uses pgoutput: resync snapshots its publications\' tables',
                          "pass --publication NAME")
    switches = control.call(lambda c: move_wal_past(c, hwm))
    confirmed = slot.confirmed_flush_lsn
    resume = confirmed if confirmed is not None and confirmed > hwm else hwm
    options = peek_options(plugin, publications=list(publications))
    watch = CallWatch(control.target, f'the peek of slot "{slot.name}" up to {resume}')
    xids = control.call(lambda c: committed_below(c, slot.name, plugin, options, resume, watch))
    if xids:
        log.info("%d transaction(s) committed on this server below %s: waiting until a snapshot sees them",
                 len(xids), resume)
        control.call(lambda c: wait_visible(c, xids, wait_timeout_s))
    start = verdict.switch_point if verdict.switch_point is not None else Lsn(0)
    return NewHistory(start, resume, tuple(xids), switches)


def invisible(fs: OutputFs, snapshot_id: str, xids: Sequence[int]) -> list[int]:
    """The ids of ``xids`` that some key chunk of the snapshot did not see (step 4; empty: the proof holds)."""
    if not xids:
        return []
    store = SnapshotStore(fs, snapshot_id)
    shots = [Snapshot.from_json(m["snapshot"]) for entry in store.plan()["tables"]
             for n, m in store.manifests(entry["dir"]).items() if n < RECHECK_FIRST]
    return [x for x in xids if not all(s.visible(x) for s in shots)]
