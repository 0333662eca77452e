"""Source preconditions that need their own server: ``wal_level=replica``, and a slot that lost its WAL.

Each server is a ThrowawayCluster started once for this module and stopped at its end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs


def start_cluster(settings: dict[str, str]) -> ThrowawayCluster:
    found = find_bindirs()
    if not found:
        pytest.skip("no PostgreSQL server binaries installed")
    inst = found.get(15) or next(iter(found.values()))
    return ThrowawayCluster(inst, settings=settings).start()


@pytest.fixture(scope="module")
def replica_server() -> Iterator[ThrowawayCluster]:
    """A server with ``wal_level = replica``: no logical decoding."""
    cluster = start_cluster({"wal_level": "replica"})
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def lost_slot_server() -> Iterator[tuple[ThrowawayCluster, str]]:
    """A server whose slot ``lost_slot`` was invalidated: max_slot_wal_keep_size was exceeded."""
    cluster = start_cluster({"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0"})
    try:
        conn = psycopg2.connect(cluster.dsn())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_create_logical_replication_slot('lost_slot', 'test_decoding')")
            cur.execute("CREATE TABLE filler (a text)")
            for _ in range(3):
                cur.execute("INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 1000)")
                cur.execute("SELECT pg_switch_wal()")
            cur.execute("CHECKPOINT")
            cur.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost_slot'")
            assert cur.fetchone() == ("lost",)
        conn.close()
        yield cluster, "lost_slot"
    finally:
        cluster.stop()


def test_check_with_wal_level_replica_exits_4_naming_the_setting_and_fix(replica_server: ThrowawayCluster, pgpoll: Any) -> None:
    result = pgpoll("check", "--dsn", replica_server.dsn())
    assert result.exit_code == 4
    assert "wal_level               fail    replica" in result.stdout
    assert "error: 1 check(s) failed, first: wal_level is replica" in result.stderr
    fix = "fix: set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server"
    assert fix in result.stderr
    assert replica_server.password not in result.output


def test_check_json_with_wal_level_replica_marks_it_failed(replica_server: ThrowawayCluster, pgpoll: Any) -> None:
    result = pgpoll("check", "--json", "--plugin", "test_decoding", "--dsn", replica_server.dsn())
    assert result.exit_code == 4
    items = {i["check"]: i for i in map(json.loads, result.stdout.splitlines())}
    assert items["wal_level"]["status"] == "fail" and items["wal_level"]["value"] == "replica"
    # The plugin cannot be probed without logical decoding; it says so instead of failing.
    assert items["plugin test_decoding"] == {"check": "plugin test_decoding", "status": "warn",
                                             "value": "not checked", "fix": "fix the failures above first"}


def test_slot_create_with_wal_level_replica_exits_4_naming_wal_level(replica_server: ThrowawayCluster, pgpoll: Any) -> None:
    result = pgpoll("slot", "create", "never_made", "--plugin", "pgoutput", "--dsn", replica_server.dsn())
    assert result.exit_code == 4
    assert "logical decoding requires wal_level >= logical" in result.stderr
    assert "fix: set wal_level = logical in postgresql.conf and restart the server" in result.stderr


def test_list_shows_the_invalidated_slot_as_lost(lost_slot_server: tuple[ThrowawayCluster, str], pgpoll: Any) -> None:
    server, slot = lost_slot_server
    result = pgpoll("slot", "list", "--json", "--dsn", server.dsn())
    assert result.exit_code == 0
    (obj,) = [o for o in map(json.loads, result.stdout.splitlines()) if o["slot"] == slot]
    assert obj["wal_status"] == "lost" and obj["restart_lsn"] is None


@pytest.mark.parametrize("command", [["peek"], ["advance", "FFFFFFFF/0"]], ids=["peek", "advance"])
def test_invalidated_slot_exits_4_saying_to_recreate_it(
    lost_slot_server: tuple[ThrowawayCluster, str], pgpoll: Any, command: list[str]
) -> None:
    server, slot = lost_slot_server
    result = pgpoll("slot", command[0], slot, *command[1:], "--dsn", server.dsn())
    assert result.exit_code == 4
    assert f'error: replication slot "{slot}" has been invalidated (wal_status lost)' in result.stderr
    fix = f"fix: drop and recreate it (pgpoll slot drop {slot}; pgpoll slot create {slot} --plugin test_decoding)"
    assert fix in result.stderr


def test_server_errors_of_an_invalidated_slot_translate_to_slot_invalidated(
    lost_slot_server: tuple[ThrowawayCluster, str],
) -> None:
    # Library level, on the same server: what PostgreSQL itself says when pgpoll's
    # own wal_status check is bypassed (the slot is lost between check and call).
    from pgpoll.errors import SlotInvalidatedError
    from pgpoll.source.server_errors import translate

    server, slot = lost_slot_server
    conn = psycopg2.connect(server.dsn())
    conn.autocommit = True
    try:
        for query in ("SELECT * FROM pg_logical_slot_peek_changes(%s, NULL, NULL)",
                      "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())"):
            with conn.cursor() as cur, pytest.raises(psycopg2.Error) as caught:
                cur.execute(query, (slot,))
            error = translate(caught.value, slot=slot)
            assert isinstance(error, SlotInvalidatedError), (query, caught.value.pgerror)
            assert "drop and recreate it" in (error.hint or "")
    finally:
        conn.close()


def test_monitoring_script_lists_the_lost_slot_as_at_risk(lost_slot_server: tuple[ThrowawayCluster, str]) -> None:
    from tests.test_sql_scripts import run_psql, sections

    server, slot = lost_slot_server
    done = run_psql(server, server.dsn(), "monitoring.sql")
    assert done.returncode == 0, done.stderr
    (risk,) = [r for r in sections(done.stdout)["slots at risk"] if r["slot_name"] == slot]
    assert risk["wal_status"] == "lost"
    assert risk["action"] == "invalidated: drop, recreate and re-snapshot"
