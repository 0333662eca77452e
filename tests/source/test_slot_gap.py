"""The gap verdict on plain values: positions, servers, timelines, and the re-check that avoids a false alarm."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgpoll.errors import SlotGapError
from pgpoll.lsn import Lsn
from pgpoll.source.server_identity import ServerIdentity, TimelineSwitch, parse_history
from pgpoll.source.slot_gap import (
    IN_SYNC,
    NO_COMMITS,
    OTHER_SERVER,
    SLOT_AHEAD,
    SLOT_BEHIND,
    TIMELINE_DIVERGED,
    OutputHead,
    check_slot_gap,
    judge,
)
from pgpoll.source.slots import SlotInfo

SYS = "7301234567890123456"
H = Lsn.parse("0/5000000")


def slot(at: str | None) -> SlotInfo:
    return SlotInfo(name="s", plugin="pgoutput", slot_type="logical", database="d", active=False, active_pid=None,
                    restart_lsn=None, confirmed_flush_lsn=Lsn.parse(at) if at else None, wal_status="reserved",
                    safe_wal_size=None, lag_bytes=0)


def verdict(at: str | None, head: OutputHead, now: ServerIdentity, history: list[TimelineSwitch] | None = None):  # type: ignore[no-untyped-def]
    def read_history(timeline: int) -> list[TimelineSwitch]:
        assert history is not None, "history read although the timeline did not change"
        return history
    return judge(slot(at), head, output_path="/o", identity=lambda: now, history=read_history)


def test_positions_on_the_same_server() -> None:
    me = ServerIdentity(SYS, 1)
    assert verdict("0/1", OutputHead(None), me).position == NO_COMMITS  # a fresh output takes any slot
    assert verdict("0/5000000", OutputHead(H, me), me).position == IN_SYNC
    assert verdict("0/4000000", OutputHead(H, me), me).position == SLOT_BEHIND  # a crash's older checkpointed slot
    assert verdict("0/4000000", OutputHead(H, None), ServerIdentity("1", 9)).position == SLOT_BEHIND  # older records
    ahead = verdict("0/5000001", OutputHead(H, me), me)
    assert ahead.position == SLOT_AHEAD and isinstance(ahead.error, SlotGapError)
    assert "is at 0/5000001, past the output's high-water mark 0/5000000" in ahead.error.message
    assert ahead.error.hint is not None and "pgpoll resync --slot s --output /o" in ahead.error.hint


def test_another_system_is_refused_even_behind_the_mark() -> None:
    found = verdict("0/4000000", OutputHead(H, ServerIdentity(SYS, 1)), ServerIdentity("42", 1))
    assert found.position == OTHER_SERVER and found.error is not None
    assert f"system {SYS}" in found.error.message and "system 42" in found.error.message


@pytest.mark.parametrize(("switch", "accepted"), [("0/5000000", True), ("0/6000000", True), ("0/4FFFFFF", False)])
def test_a_new_timeline_is_accepted_only_when_it_left_the_old_one_at_or_past_the_mark(switch: str, accepted: bool) -> None:
    history = [TimelineSwitch(1, Lsn.parse(switch))]
    found = verdict("0/4000000", OutputHead(H, ServerIdentity(SYS, 1)), ServerIdentity(SYS, 2), history)
    if accepted:
        assert found.position == SLOT_BEHIND and found.error is None
    else:
        assert found.position == TIMELINE_DIVERGED and found.error is not None
        assert f"({switch}, 0/5000000] of timeline 1" in found.error.message and "timeline 2" in found.error.message


def test_a_timeline_that_does_not_descend_from_the_output_is_refused() -> None:
    other_branch = [TimelineSwitch(2, Lsn.parse("0/7000000"))]
    found = verdict("0/4000000", OutputHead(H, ServerIdentity(SYS, 4)), ServerIdentity(SYS, 3), other_branch)
    assert found.position == TIMELINE_DIVERGED and "up to 0/5000000" in str(found.error)  # 3 is older than 4


def test_history_files_parse_as_the_server_writes_them() -> None:
    text = "1\t0/3000060\tno recovery target specified\n\n2\t0/5000000\tbefore 2026-01-01 00:00:00+00\n"
    assert parse_history(text) == [TimelineSwitch(1, Lsn.parse("0/3000060")), TimelineSwitch(2, Lsn.parse("0/5000000"))]


def test_a_refusal_is_read_again_and_a_concurrent_publish_clears_it() -> None:
    me = ServerIdentity(SYS, 1)
    heads: Iterator[OutputHead] = iter([OutputHead(Lsn.parse("0/4000000"), me), OutputHead(H, me)])
    found = check_slot_gap(lambda: slot("0/5000000"), lambda: next(heads), output_path="/o", identity=lambda: me,
                           history=lambda t: [])
    assert found.position == IN_SYNC and found.error is None


def test_a_slot_past_the_mark_on_another_system_is_another_server_not_a_gap() -> None:
    found = verdict("0/6000000", OutputHead(H, ServerIdentity(SYS, 1)), ServerIdentity("42", 1))
    assert found.position == OTHER_SERVER and found.error is not None and found.switch_point is None
    assert found.error.hint is not None and "run `pgpoll resync --slot s --output /o`" in found.error.hint
    assert "lost-slot.md#a-lost-slot-another-server-a-diverged-timeline" in found.error.hint


def test_a_slot_past_the_mark_on_a_diverged_timeline_is_diverged_not_a_gap() -> None:
    history = [TimelineSwitch(1, Lsn.parse("0/4000000"))]
    found = verdict("0/6000000", OutputHead(H, ServerIdentity(SYS, 1)), ServerIdentity(SYS, 2), history)
    assert found.position == TIMELINE_DIVERGED and found.error is not None
    assert "(0/4000000, 0/5000000] of timeline 1" in found.error.message
    assert found.error.hint is not None and "a-lost-slot-another-server-a-diverged-timeline" in found.error.hint
    assert "run `pgpoll resync --slot s --output /o`" in found.error.hint  # it takes the output to the new history
    assert found.switch_point == Lsn.parse("0/4000000")  # where the resync's gap record starts


def test_a_slot_past_the_mark_after_a_safe_failover_is_a_gap() -> None:
    history = [TimelineSwitch(1, Lsn.parse("0/5000000"))]  # timeline 2 left 1 at the mark: the same history
    found = verdict("0/6000000", OutputHead(H, ServerIdentity(SYS, 1)), ServerIdentity(SYS, 2), history)
    assert found.position == SLOT_AHEAD and found.error is not None
    assert found.error.hint is not None and "pgpoll resync --slot s --output /o" in found.error.hint
