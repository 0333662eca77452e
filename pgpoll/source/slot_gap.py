"""Whether a slot can go on feeding an output: the gap check ``ingest``, ``status`` and ``check`` share.

pgpoll advances a slot only to the ``end`` of a commit-log record it has
just created (:mod:`pgpoll.ingest.run`; a batch that brings nothing past the
high-water mark H is discarded without an advance; an idle run's and a
heartbeat's batches publish a record before they advance), so after any run
of its own the slot's ``confirmed_flush_lsn`` is at most H. A slot past H was
moved by something else — dropped and recreated (a new slot starts at the
end of WAL), consumed by another reader (``pg_logical_slot_get_changes``),
advanced by hand — and the changes between H and the slot are gone from it:
reading on would lose them silently. (The Spark stream source keeps its own
offsets in Spark's checkpoint and writes no commit log; on the slot of an
ingest output it is "another reader".)

A slot *behind* H is normal after a server crash (an advance reaches disk
only at the next checkpoint) and the next batch re-advances it to H. But
only on the same history: after a failover to a standby that had not
received everything the output read, the new primary's timeline reuses the
LSNs up to H for other transactions, and the re-advance would skip them.
So every record carries the server's system identifier and timeline
(:mod:`pgpoll.source.server_identity`), and a slot at or behind H is
accepted when the server is the same system on the same timeline, or on a
timeline whose history shows the output's timeline continuing past H (its
switch point at or past H). Anything else names the range the output may
hold that this server never had. A record without that field (written by
an older pgpoll) is judged by position only, as before.

The order of the reads avoids false alarms from a concurrent run: the slot
is read first, then the output's head. A run advances the slot only after
its record exists, so whatever the slot shows was published before the
head is read. A verdict that would fail is read once more, both positions
again, and stands only if the second reading agrees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pgpoll.errors import PrivilegeError, SlotGapError
from pgpoll.lsn import Lsn
from pgpoll.source.server_identity import ServerIdentity, TimelineSwitch
from pgpoll.source.slots import SlotInfo

NO_COMMITS = "no_commits"
IN_SYNC = "in_sync"
SLOT_BEHIND = "slot_behind_output"
SLOT_AHEAD = "slot_ahead_of_output"
OTHER_SERVER = "other_server"
TIMELINE_DIVERGED = "timeline_diverged"
TIMELINE_UNVERIFIED = "timeline_unverified"
"""The server is on another timeline than the output's newest record and its history cannot be read (the role
lacks EXECUTE on ``pg_read_binary_file``): the run refuses rather than guess; the error is a :class:`PrivilegeError`."""

GAP_POSITIONS = (SLOT_AHEAD, OTHER_SERVER, TIMELINE_DIVERGED, TIMELINE_UNVERIFIED)
"""The positions that refuse a run (exit 4): each has an error, a :class:`SlotGapError` but for the last."""

FIX = ("run `pgpoll resync --slot {slot} --output {output}` (see docs/how-to/lost-slot.md); "
       "{written} and the slot was not moved")
NOTHING_WRITTEN = "nothing was written"
DURING_RUN = "the run's earlier batches stay committed, nothing after them was written"
"""The fix of a slot past the output: ``resync`` marks the gap and snapshots the tables on the same output."""

OTHER_HISTORY_FIX = (
    "run `pgpoll resync --slot {slot} --output {output}`: it marks the changes this server never had, brings the "
    "server's WAL past the output's mark and snapshots every table, so materialize rebuilds each state from this "
    "server (or snapshot into a new output; see docs/how-to/lost-slot.md#a-lost-slot-another-server-a-diverged-timeline); "
    "nothing was written and the slot was not moved"
)
"""The fix of another server or a diverged timeline: ``resync`` takes the output over to the new history
(:mod:`pgpoll.snapshot.resync_history`)."""


@dataclass(frozen=True)
class OutputHead:
    """What the gap check needs of an output: its high-water mark and the server its newest record names."""

    high_water_mark: Lsn | None
    server: ServerIdentity | None = None


@dataclass(frozen=True)
class Verdict:
    """The slot against the output: ``position`` (one of the constants above) and, when it refuses, the error."""

    position: str
    slot: SlotInfo
    output: OutputHead
    server: ServerIdentity
    """The server as read now (what the next record will name)."""
    error: SlotGapError | PrivilegeError | None = None
    switch_point: Lsn | None = None
    """A diverged timeline: where the server's history left the output's (None: another branch or system)."""


def judge(
    slot: SlotInfo, output: OutputHead, *, output_path: str,
    identity: Callable[[], ServerIdentity], history: Callable[[int], list[TimelineSwitch]],
) -> Verdict:
    """The verdict for ``slot`` as read before ``output``'s head (pure but for the two lazy server reads).

    ``identity`` is always called: a fresh output's first record names the
    server too, and the verdict carries it for that. ``history(timeline)``
    is called only when the output's newest record names another timeline;
    the :class:`PrivilegeError` it raises without the grant becomes the
    ``timeline_unverified`` verdict (so ``status`` can print its report first).

    The server is judged before the position: on another system, or on a
    timeline that left the output's before its mark, the slot's LSNs are
    another history, and comparing them with the mark means nothing (a slot
    "past" the mark there is no gap ``resync`` could mark: the output holds
    changes the server never had, whatever the slot's position).
    """
    hwm = output.high_water_mark
    server = identity()
    if hwm is None:
        return Verdict(NO_COMMITS, slot, output, server)
    was = output.server
    other_fix = OTHER_HISTORY_FIX.format(slot=slot.name, output=output_path)
    if was is not None and was.system_identifier != server.system_identifier:
        return Verdict(OTHER_SERVER, slot, output, server, SlotGapError(
            f"the output up to {hwm} was read from database system {was.system_identifier}, the slot "
            f'"{slot.name}" is on system {server.system_identifier}: its positions are another history',
            other_fix, lsn=str(hwm)))
    if was is not None and was.timeline != server.timeline:
        try:
            switch = _switch_point(was.timeline, server.timeline, history)
        except PrivilegeError as exc:  # the history file needs a grant: refuse, naming it, rather than guess
            return Verdict(TIMELINE_UNVERIFIED, slot, output, server, exc)
        if switch is None or switch < hwm:
            held = f"({switch}, {hwm}]" if switch is not None else f"up to {hwm}"
            return Verdict(TIMELINE_DIVERGED, slot, output, server, SlotGapError(
                f"the output holds changes {held} of timeline {was.timeline} that this server "
                f"(timeline {server.timeline}) never had: it left timeline {was.timeline} "
                + (f"at {switch}, before the output's high-water mark" if switch is not None else "on another branch"),
                other_fix, lsn=str(hwm)), switch_point=switch)
    ahead = moved_past(slot, hwm, output_path=output_path)
    if ahead is not None:
        return Verdict(SLOT_AHEAD, slot, output, server, ahead)
    return Verdict(IN_SYNC if slot.confirmed_flush_lsn == hwm else SLOT_BEHIND, slot, output, server)


def moved_past(slot: SlotInfo, position: Lsn | None, *, output_path: str, during_run: bool = False,
               ) -> SlotGapError | None:
    """The refusal of a slot past the output's ``position`` (None: at or behind it, or a fresh output).

    pgpoll never advances a slot past the position of an output it feeds
    (module docstring), so the changes between were taken by something else.
    ``during_run``: found between a run's batches (its earlier batches stay).
    """
    confirmed = slot.confirmed_flush_lsn
    if position is None or confirmed is None or confirmed <= position:
        return None
    return SlotGapError(
        f'slot "{slot.name}" is at {confirmed}, past the output\'s high-water mark {position}: the changes between '
        "were never written (the slot was dropped and recreated, consumed by another reader, or advanced by hand)",
        FIX.format(slot=slot.name, output=output_path, written=DURING_RUN if during_run else NOTHING_WRITTEN),
        lsn=str(position))


def _switch_point(recorded: int, current: int, history: Callable[[int], list[TimelineSwitch]]) -> Lsn | None:
    """Where the current timeline's history left the recorded one (None: the recorded one is not an ancestor)."""
    if current < recorded:
        return None  # timelines only grow along a history: the server is on an older branch
    for switch in history(current):
        if switch.timeline == recorded:
            return switch.switch_point
    return None


def check_slot_gap(
    read_slot: Callable[[], SlotInfo], read_output: Callable[[], OutputHead], *, output_path: str,
    identity: Callable[[], ServerIdentity], history: Callable[[int], list[TimelineSwitch]],
) -> Verdict:
    """Read the slot, then the output's head, and judge; a refusal is read and judged once more before it stands.

    The order and the second reading are what keep a concurrent run that
    publishes and advances in between from causing a false alarm (module
    docstring). Returns the verdict; its ``error`` is the caller's to raise.
    """
    verdict = judge(read_slot(), read_output(), output_path=output_path, identity=identity, history=history)
    if verdict.error is None:
        return verdict
    return judge(read_slot(), read_output(), output_path=output_path, identity=identity, history=history)
