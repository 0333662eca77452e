"""The unsafe failover: a promoted standby that never received WAL the output read is refused (exit 4).

Its own throwaway PostgreSQL 15 primary and ``pg_basebackup`` standby (a
promotion cannot happen on the shared server). The standby stops streaming
(``primary_conninfo`` emptied and reloaded), the primary writes and ``ingest``
reads past what the standby has, the standby is promoted: timeline 2 leaves
timeline 1 at the standby's end of WAL, below the output's high-water mark.
A slot created on the new primary is behind the mark, where a re-advance
would silently skip the new primary's transactions. ``ingest`` and ``check``
must refuse it, naming the range; without the privilege to read the timeline
history they refuse too, naming the grant; ``resync`` refuses (a gap marker cannot take back changes the
server never had).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli import exitcodes
from pgpoll.cli.main import cli
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, wait_until
from tests.ingest.conftest import ingest

VERSION = 15


def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = connect(resolve_dsn(dsn), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture
def promoted(tmp_path: Path) -> Iterator[tuple[ThrowawayCluster, str, str]]:
    """(the promoted standby, the output written from the old primary, its high-water mark)."""
    inst = find_bindirs().get(VERSION)
    if inst is None or not inst.has_test_decoding:
        pytest.skip(f"PostgreSQL {VERSION} with test_decoding is not installed here")
    primary = ThrowawayCluster(inst).start()
    standby: ThrowawayCluster | None = None
    try:
        _sql(primary.dsn(), "CREATE TABLE items (id int PRIMARY KEY, v text)")
        _sql(primary.dsn(), "SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        standby = primary.standby()
        _sql(primary.dsn(), "INSERT INTO items SELECT g, 'a' FROM generate_series(1, 5) g")
        end = _sql(primary.dsn(), "SELECT pg_current_wal_lsn()::text")[0][0]
        assert wait_until(lambda: _sql(standby.dsn(), "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (end,))[0][0])
        _sql(standby.dsn(), "ALTER SYSTEM SET primary_conninfo = ''")  # no more streaming: an asynchronous
        _sql(standby.dsn(), "SELECT pg_reload_conf()")                   # standby that falls behind
        assert wait_until(lambda: not _sql(standby.dsn(), "SELECT count(*) FROM pg_stat_wal_receiver")[0][0])
        _sql(primary.dsn(), "INSERT INTO items SELECT g, repeat('b', 500) FROM generate_series(6, 2005) g")
        output = str(tmp_path / "out")
        run = ingest(primary.dsn(), "--slot", "s", "--output", output)
        assert run.exit_code == 0 and run.summary is not None and run.summary["changes"] == 2005, run.stderr
        primary.stop()
        _sql(standby.dsn(), "SELECT pg_promote(true)")
        _sql(standby.dsn(), "SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        yield standby, output, run.summary["last_lsn"]
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def test_a_slot_on_a_timeline_that_left_before_the_mark_is_refused(promoted: tuple[ThrowawayCluster, str, str]) -> None:
    server, output, hwm = promoted
    history = _sql(server.dsn(), "SELECT convert_from(pg_read_binary_file('pg_wal/00000002.history'), 'UTF8')")[0][0]
    switch = history.split()[1]
    confirmed = _sql(server.dsn(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots")[0][0]
    assert Lsn.parse(confirmed) < Lsn.parse(hwm) and Lsn.parse(switch) < Lsn.parse(hwm)

    refused = ingest(server.dsn(), "--slot", "s", "--output", output)

    assert refused.exit_code == exitcodes.SOURCE == 4, refused.stderr
    assert f"the output holds changes ({switch}, {hwm}] of timeline 1 that this server (timeline 2) never had" \
        in refused.stderr
    assert "run `pgpoll resync" not in refused.stderr  # resync refuses this case: the hint names a new output
    assert "lost-slot.md#a-lost-slot-another-server-a-diverged-timeline" in refused.stderr
    assert _sql(server.dsn(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots")[0][0] == confirmed
    resync = CliRunner().invoke(cli, ["resync", "--slot", "s", "--output", output, "--json"],
                                env={"PGPOLL_DSN": server.dsn()})
    assert resync.exit_code == 4 and "cannot take back changes the server never had" in resync.stderr, resync.output
    assert CommitLog(open_output(output)).state().head == 1  # no gap marked: a marker cannot fix this case

    _sql(server.dsn(), "CREATE ROLE watcher LOGIN REPLICATION PASSWORD 'w'")
    role_dsn = server.dsn(user="watcher", password="w")
    no_grant = ingest(role_dsn, "--slot", "s", "--output", output)
    assert no_grant.exit_code == 4 and "GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO" in no_grant.stderr
    assert "pg_wal/00000002.history" in no_grant.stderr and "w@" not in no_grant.stderr
    runner = CliRunner()
    status = runner.invoke(cli, ["status", "--output", output, "--json"], env={"PGPOLL_DSN": role_dsn})
    assert status.exit_code == 4 and "GRANT EXECUTE ON FUNCTION" in status.stderr, status.output
    reported = json.loads(status.stdout.splitlines()[0])  # the report is printed first, then the exit
    assert reported["position"] == "timeline_unverified" and "timeline_unverified" in reported["alerts"]
    checked = runner.invoke(cli, ["check", "--json"], env={"PGPOLL_DSN": role_dsn})
    item = next(json.loads(r) for r in checked.stdout.splitlines() if '"timeline history"' in r)
    assert item["status"] == "warn" and "GRANT EXECUTE ON FUNCTION pg_read_binary_file(text)" in item["fix"]
    _sql(server.dsn(), "GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO watcher")
    granted = ingest(role_dsn, "--slot", "s", "--output", output)
    assert granted.exit_code == 4 and f"({switch}, {hwm}] of timeline 1" in granted.stderr, granted.stderr
