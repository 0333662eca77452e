"""The run's gap check: the slot against the output before anything is read, and the server before each publish.

:mod:`pgpoll.source.slot_gap` decides; this module feeds it the run's
control connection and commit log. It runs after recovery (which may finish
a crashed run's record) and before the first plan, so a refusal writes
nothing and moves nothing: the slot is only read.
"""

from __future__ import annotations

import functools

from pgpoll.errors import SlotGapError
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.head import output_head
from pgpoll.source.control import ControlConnection
from pgpoll.source.server_identity import ServerIdentity, read_identity, read_timeline_history
from pgpoll.source.slot_gap import OutputHead, Verdict, check_slot_gap


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
