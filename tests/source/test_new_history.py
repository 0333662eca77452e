"""The pure part of :mod:`pgpoll.source.new_history`: 32-bit ids from a peek widened to the full id nearest a reference.

The server side (WAL moved past the mark, the peek up to it, the wait) is
proved with a real promoted standby in ``tests/ingest/test_slot_gap_failover.py``.
"""

from __future__ import annotations

from pgpoll.source.new_history import _nearest


def test_an_id_is_widened_to_the_full_id_nearest_the_reference_on_either_side() -> None:
    assert _nearest(10, 12) == 10
    assert _nearest(14, 12) == 14  # a commit still waiting for a synchronous standby: at or past the snapshot's xmax
    epoch = 1 << 32
    assert _nearest(epoch - 5, epoch + 3) == epoch - 5  # the previous epoch
    assert _nearest(3, epoch - 2) == epoch + 3  # the next one
