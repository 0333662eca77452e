"""The run's gap check: the slot against the output before anything is read, and again around every batch.

:mod:`pgpoll.source.slot_gap` decides; this module feeds it the run's
control connection and commit log. It runs after recovery (which may finish
a crashed run's record) and before the first plan, so a refusal writes
nothing and moves nothing: the slot is only read.

The start-of-run check is not enough on its own: a run reads the slot again
for each batch, and a batch's peek starts at ``max(confirmed, H)``, so a
slot moved past the output *during* the run (consumed by another reader,
recreated, advanced by hand) would make the next batch start past changes
nobody wrote. :func:`check_slot_moved` compares the slot with the output's
position before each batch's plan and again just before its publish. Within
a run nothing but the run itself can move the slot without being a gap: it
holds the output's lease (another ingest exits 3), it advances only to the
``end`` of a record it has just published (so the output's position is
already there), and neither ``materialize`` nor ``resync``'s snapshot moves
a slot (the Spark stream source does, but on an ingest output's slot it *is*
another reader).
"""

from __future__ import annotations

import functools

from pgpoll.errors import SlotGapError
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.head import output_head
from pgpoll.source.control import ControlConnection
from pgpoll.source.server_identity import ServerIdentity, read_identity, read_timeline_history
from pgpoll.source.slot_gap import OutputHead, Verdict, check_slot_gap, moved_past


def check_output(control: ControlConnection, sink: BatchSink, output: str) -> Verdict:
    """The slot against ``sink``'s commit log (read in that order); raises the verdict's :class:`SlotGapError`."""

    def head() -> OutputHead:
        hwm, record = output_head(sink.log)
        return OutputHead(hwm, ServerIdentity.from_json(record.server) if record is not None else None)

    verdict = check_slot_gap(
        control.slot_info, head, output_path=output, identity=lambda: control.call(read_identity),
        history=lambda timeline: control.call(functools.partial(read_timeline_history, timeline=timeline)),
    )
    if verdict.error is not None:
        raise verdict.error
    return verdict


def check_slot_moved(control: ControlConnection, sink: BatchSink, output: str, known: Lsn | None = None) -> None:
    """Raise :class:`SlotGapError` when the slot is now past the output's position (a move during the run).

    The position is :func:`output_head`'s, which knows a gap record's
    ``resume`` (a plan's high-water mark is still the mark from before a
    resync, and would be a false alarm after every one). The slot is read
    first and the head after it, and a refusal is read once more, as in the
    start-of-run check. Batches committed earlier in the run stay committed:
    the output is exact up to its position; the changes after it are gone
    from the slot. ``known`` is a position the output is known to hold (the end this run last published, a
    plan's high-water mark): a slot at or behind it has not moved, and the commit log is not read (on an object
    store that is a few requests a batch saved).
    """
    slot = control.slot_info()
    if known is not None and (slot.confirmed_flush_lsn is None or slot.confirmed_flush_lsn <= known):
        return
    if moved_past(slot, output_head(sink.log)[0], output_path=output, during_run=True) is None:
        return
    error = moved_past(control.slot_info(), output_head(sink.log)[0], output_path=output, during_run=True)
    if error is not None:
        raise error


def confirm_server(control: ControlConnection, expected: ServerIdentity) -> ServerIdentity:
    """The server again, before a batch is published: a failover during the run refuses the batch (exit 4).

    The batch was read from the server the run checked at its start; if the
    control connection now reaches another system or timeline (a multi-host
    DSN after a promotion), the next run's check decides about it instead.
    """
    now = control.call(read_identity)
    if now != expected:
        raise SlotGapError(
            f"the server changed during the run (system {expected.system_identifier} timeline {expected.timeline} "
            f"-> system {now.system_identifier} timeline {now.timeline}): the batch was not published",
            "rerun: the next run checks the slot against the output on this server first",
        )
    return now
