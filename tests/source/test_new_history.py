""":mod:`pgpoll.source.new_history`: ids widened to the nearest epoch; WAL moved past a target, or refused.

The peek up to the mark and the wait are proved with a real promoted
standby in ``tests/ingest/test_slot_gap_failover.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest

from pgpoll.cli import exitcodes
from pgpoll.errors import SlotGapError
from pgpoll.lsn import Lsn
from pgpoll.source.new_history import MAX_DISTANCE, _nearest, flush_lsn, move_wal_past


def test_an_id_is_widened_to_the_full_id_nearest_the_reference_on_either_side() -> None:
    assert _nearest(10, 12) == 10
    assert _nearest(14, 12) == 14  # a commit still waiting for a synchronous standby: at or past the snapshot's xmax
    epoch = 1 << 32
    assert _nearest(epoch - 5, epoch + 3) == epoch - 5  # the previous epoch
    assert _nearest(3, epoch - 2) == epoch + 3  # the next one


def test_wal_is_moved_past_a_target_with_switches_and_refused_beyond_the_bound_or_without_the_grant(db: Any) -> None:
    conn = db.connect()
    now = flush_lsn(conn)
    assert move_wal_past(conn, now) == 0  # there already: nothing written
    target = Lsn(int(now) + 1)
    assert move_wal_past(conn, target) >= 1 and flush_lsn(conn) >= target

    far = Lsn(int(flush_lsn(conn)) + MAX_DISTANCE + 1)
    with pytest.raises(SlotGapError) as beyond:
        move_wal_past(conn, far)
    assert f"below the output's high-water mark {far}" in beyond.value.message
    assert "wait until the server has written past" in (beyond.value.hint or "")

    role = "nowalswitch_" + db.name
    db.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        plain = psycopg2.connect(db.server.dsn(db.name, user=role, password="pw"))
        plain.autocommit = True
        before = flush_lsn(plain)
        with pytest.raises(SlotGapError) as refused:
            move_wal_past(plain, Lsn(int(before) + 1))
        plain.close()
    finally:
        db.execute(f"DROP ROLE {role}")
    assert exitcodes.exit_code_for(refused.value) == exitcodes.SOURCE == 4
    assert "GRANT EXECUTE ON FUNCTION pg_switch_wal() TO" in (refused.value.hint or "")
    assert "nothing was written and the slot was not moved" in (refused.value.hint or "")
