"""Mirror equality with existing rows: tables filled before the slot existed reach the lake through
``pgpoll snapshot``, and the snapshot plus the change stream equal ``SELECT * FROM`` the source.

Writers run during the snapshot (inserts, deletes, updates of TOASTed rows' other columns, key
updates that move rows across chunk boundaries, TRUNCATE); the snapshot is SIGKILLed and resumed;
ingest crashes and runs while the snapshot process reads. The visibility race is forced with a commit that waits for a
synchronous standby that does not exist: its commit record is in the WAL before a chunk is read
while the transaction is still invisible to that chunk's snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.sink.layout import table_dir_name
from tests.ingest.conftest import REPO, RunResult, _summary, ingest, ingest_process
from tests.materialize.conftest import materialize
from tests.materialize.test_mirror import Workload, _assert_mirror

TABLES = ("t_types", "t_toast", "t_full", "t_trunc", "t_narrow")


def snapshot(dsn: str, *args: str) -> RunResult:
    """``pgpoll snapshot ARGS --json`` in this process (shares the session's SparkSession)."""
    result = CliRunner().invoke(cli, ["snapshot", *args, "--json"], env={"PGPOLL_DSN": dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return RunResult(result.exit_code, _summary(result.stdout), result.stdout, result.stderr)


def snapshot_killed(dsn: str, args: list[str], after: float) -> int:
    """``python jobs/snapshot.py ARGS`` as its own process, SIGKILLed ``after`` seconds in (or when it ends first)."""
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.Popen([sys.executable, str(REPO / "jobs" / "snapshot.py"), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _fill(db: Any, seed: int, statements: int) -> Workload:
    work = Workload(db, seed)
    work.create()
    work.run(statements)
    db.execute("INSERT INTO t_toast SELECT 100000 + g, repeat(md5(g::text), 400), 'old' FROM generate_series(1, 30) g")
    db.execute("INSERT INTO t_full VALUES (1, 'dup'), (1, 'dup'), (2, NULL)")
    db.execute("INSERT INTO t_trunc SELECT 200000 + g, 'v' FROM generate_series(1, 40) g")
    # no TOASTable column: read in chunks, one snapshot per chunk, and no recheck
    db.execute("CREATE TABLE t_narrow (id int PRIMARY KEY, n bigint, u uuid)")
    db.execute("INSERT INTO t_narrow SELECT g, g * 7, md5(g::text)::uuid FROM generate_series(1, 120) g")
    return work


class Writer(threading.Thread):
    """Random transactions against the same tables while the snapshot reads them (ids of its own)."""

    def __init__(self, db: Any, seed: int) -> None:
        super().__init__(daemon=True)
        self.work = Workload(db, seed)
        self.work.next_id = 500000
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.work.run(5)
                conn = self.work.db.connect()
                with conn.cursor() as cur:  # key moves across chunk boundaries, TOASTed rows' other columns
                    cur.execute("UPDATE t_types SET id = id + 700000 WHERE id = (SELECT min(id) FROM t_types WHERE id < 700000)")
                    cur.execute("UPDATE t_toast SET note = 'touched' WHERE id = (SELECT max(id) FROM t_toast WHERE id > 100000)")
                    cur.execute("UPDATE t_narrow SET id = id + 1000 WHERE id = (SELECT min(id) FROM t_narrow WHERE id < 1000)")
                    cur.execute("UPDATE t_narrow SET id = id - 1000 + 1 WHERE id = (SELECT max(id) FROM t_narrow WHERE id > 1000)"
                                " AND NOT EXISTS (SELECT 1 FROM t_narrow WHERE id = (SELECT max(id) FROM t_narrow) - 999)")
                    cur.execute("UPDATE t_narrow SET n = n + 1 WHERE id % 5 = 0")
                    cur.execute("DELETE FROM t_narrow WHERE id = (SELECT min(id) + 3 FROM t_narrow)")
                conn.close()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, self.error


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_snapshot_and_changes_mirror_the_source(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    db.require_plugin(plugin)
    work = _fill(db, seed=11 + (plugin == "pgoutput"), statements=150)
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    out = tmp_path / "out"
    ingest_args = ["--slot", slot, "--output", str(out), "--typed-tables", "--batch-changes", "200"]
    snap_args = ["--slot", slot, "--output", str(out), "--chunk-rows", "7", "--parallelism", "2"]
    if plugin == "pgoutput":
        db.execute(f"CREATE PUBLICATION mirror FOR TABLE {', '.join(TABLES)}")
        ingest_args += ["--publication", "mirror"]
        snap_args += ["--publication", "mirror"]
    else:
        snap_args += ["--tables", ",".join(f"public.{t}" for t in TABLES)]
        ingest_args += ["--tables", ",".join(f"public.{t}" for t in TABLES)]
    work.run(30)
    assert ingest(db.dsn, *ingest_args).exit_code == 0

    writer = Writer(db, seed=5)
    writer.start()
    try:
        # the snapshot (its own process, SIGKILLed mid-way) runs while ingest crashes once and then runs
        snapper = threading.Thread(target=snapshot_killed, args=(db.dsn, snap_args, 12.0), daemon=True)
        snapper.start()
        crashed = ingest_process(db.dsn, *ingest_args, env={"PGPOLL_FAULT": "after-write"})
        assert crashed.exit_code == 137, crashed.stderr[-2000:]
        assert ingest(db.dsn, *ingest_args).exit_code == 0
        snapper.join(timeout=300)
        done = snapshot(db.dsn, *snap_args)  # resumes the killed one (or finds it complete)
    finally:
        writer.finish()
    assert done.exit_code == 0, done.stderr
    assert done.summary is not None and done.summary["status"] == "ok", done.stdout
    db.execute("TRUNCATE t_trunc")
    db.execute("INSERT INTO t_trunc VALUES (1, 'after truncate')")
    work.run(20)
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, err = materialize(str(out))
    assert code == 0, err
    for table in TABLES:
        _assert_mirror(db, spark, out, table)
    by_name = {t["table"]: t for t in tables}
    for table in ("public.t_types", "public.t_narrow"):
        assert by_name[table]["snapshot"]["complete"] is True and by_name[table]["snapshot"]["converged"] is True
    plan = json.loads(next((out / "_pgpoll" / "snapshots").glob("*/plan.json")).read_text())
    modes = {t["table"]: t["mode"] for t in plan["tables"]}
    assert modes["t_narrow"] == "chunked" and modes["t_toast"] == "chunked" and modes["t_full"] == "shared"
    assert {t["table"] for t in plan["tables"] if t["rechecks"]} >= {"t_toast"}


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_existing_rows_of_every_type_mirror_on_every_version(db_any: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    """The server's own text of every type, per version and plugin: snapshot rows and later changes agree with it."""
    db = db_any
    db.require_plugin(plugin)
    work = _fill(db, seed=db.major, statements=60)
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    out = tmp_path / "out"
    args = ["--slot", slot, "--output", str(out)]
    if plugin == "pgoutput":
        db.execute(f"CREATE PUBLICATION mirror FOR TABLE {', '.join(TABLES)}")
        args += ["--publication", "mirror"]
    else:
        args += ["--tables", ",".join(f"public.{t}" for t in TABLES)]
    done = snapshot(db.dsn, *args)
    assert done.exit_code == 0, done.stderr
    work.run(20)
    assert ingest(db.dsn, *args, "--typed-tables").exit_code == 0
    code, _tables, err = materialize(str(out))
    assert code == 0, err
    for table in TABLES:
        _assert_mirror(db, spark, out, table)


def test_a_commit_waiting_for_a_synchronous_standby_is_applied_over_the_snapshot(db: Any, spark: Any,
                                                                                tmp_path: Path) -> None:
    """The commit record is in the WAL before the chunk is read, yet the chunk's snapshot does not see it."""
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE race (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO race SELECT g, 'old' FROM generate_series(1, 20) g")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE race")
    out = tmp_path / "out"
    db.execute(f'ALTER DATABASE "{db.name}" SET synchronous_commit = local')
    admin = db.server.dsn("postgres")
    waiting = db.connect(autocommit=True)
    blocked: threading.Thread | None = None
    try:
        _set_standby_names(admin, "nosuchstandby")
        with waiting.cursor() as cur:
            cur.execute("SET synchronous_commit = on")
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]

        def update() -> None:
            with waiting.cursor() as cur:
                cur.execute("UPDATE race SET v = 'new' WHERE id = 13")  # autocommit: waits in SyncRep

        blocked = threading.Thread(target=update, daemon=True)
        blocked.start()
        for _ in range(100):
            if db.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0] == "SyncRep":
                break
            time.sleep(0.1)
        else:
            pytest.fail("the UPDATE never waited for the synchronous standby")
        commit_lsn = db.execute("SELECT pg_current_wal_lsn()")[0][0]
        result: dict[str, RunResult] = {}
        runner = threading.Thread(target=lambda: result.setdefault("r", snapshot(
            db.dsn, "--slot", slot, "--output", str(out), "--publication", "p")), daemon=True)
        runner.start()
        manifests = out / "_pgpoll" / "snapshots"
        for _ in range(600):  # the chunk is read (and its manifest written) while the commit still waits
            if list(manifests.glob("*/*/chunk-*.json")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the snapshot never read its chunk")
        chunk = json.loads(next(manifests.glob("*/*/chunk-*.json")).read_text())
        assert chunk["snapshot"]["xmax"] <= _xid_of_row(db) or _xid_of_row(db) in chunk["snapshot"]["xip"]
        _set_standby_names(admin, "")
        blocked.join(timeout=30)
        runner.join(timeout=300)
    finally:
        _set_standby_names(admin, "")
        db.execute(f'ALTER DATABASE "{db.name}" RESET synchronous_commit')
        if blocked is not None:
            blocked.join(timeout=30)
        waiting.close()
    assert result["r"].exit_code == 0, result["r"].stderr
    assert db.execute("SELECT %s::pg_lsn < pg_current_wal_lsn()", (commit_lsn,))[0][0]
    part = next((out / "snapshots").glob(f"*/{table_dir_name('public', 'race')}/chunk=*/*.parquet"))
    import pyarrow.parquet as pq

    snapped = {r["id"]: r["v"] for r in pq.read_table(part).to_pylist()}
    assert snapped[13] == "old", "the chunk was read before the waiting commit became visible"
    assert ingest(db.dsn, "--slot", slot, "--output", str(out), "--publication", "p", "--typed-tables").exit_code == 0
    code, _tables, err = materialize(str(out))
    assert code == 0, err
    state = {r["id"]: r["v"] for r in spark.read.parquet(str(out / "state" / table_dir_name("public", "race"))).collect()}
    assert state == {i: ("new" if i == 13 else "old") for i in range(1, 21)}


def _xid_of_row(db: Any) -> int:
    """The full id of the transaction that wrote the newest version of row 13 (it is still in progress)."""
    return int(db.execute("SELECT xmax::text::bigint FROM race WHERE id = 13")[0][0]) | (
        int(db.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")[0][0]) >> 32 << 32)


def _set_standby_names(admin_dsn: str, value: str) -> None:
    import psycopg2

    conn = psycopg2.connect(admin_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("ALTER SYSTEM SET synchronous_standby_names = %s", (value,))
        cur.execute("SELECT pg_reload_conf()")
    conn.close()
    time.sleep(0.3)


def _rows(db: Any, query: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in db.execute(query))


def _state(spark: Any, out: Path, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    path = out / "state" / table_dir_name("public", table)
    if not path.exists():
        return []
    frame = spark.read.parquet(str(path))
    return sorted(tuple(r) for r in frame.select(*[f"`{c}`" for c in columns]).collect())


def test_publication_shapes_mirror_after_snapshot(db_any: Any, spark: Any, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Partitions with and without publish_via_partition_root, a row filter and column list, a table
    added to the publication after the slot, a key under an ICU collation, VACUUM FULL during the
    snapshot, and ADD COLUMN ... DEFAULT repaired by a re-snapshot of that table."""
    db = db_any
    db.require_plugin("pgoutput")
    icu = bool(db.execute("SELECT count(*) FROM pg_collation WHERE collname = 'und-x-icu'")[0][0])
    db.execute("CREATE TABLE p_root (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE p_root_a PARTITION OF p_root FOR VALUES FROM (0) TO (500)")
    db.execute("CREATE TABLE p_root_b PARTITION OF p_root FOR VALUES FROM (500) TO (10000)")
    db.execute("CREATE TABLE p_leaf (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE p_leaf_a PARTITION OF p_leaf FOR VALUES FROM (0) TO (500)")
    db.execute("CREATE TABLE p_leaf_b PARTITION OF p_leaf FOR VALUES FROM (500) TO (10000)")
    db.execute("CREATE TABLE filtered (id int PRIMARY KEY, v int, secret text)")
    db.execute("CREATE TABLE late (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE addcol (id int PRIMARY KEY, v text)")
    keyed = "k text COLLATE \"und-x-icu\" PRIMARY KEY" if icu else "k numeric PRIMARY KEY"
    db.execute(f"CREATE TABLE odd_key ({keyed}, v text)")
    for t in ("p_root", "p_leaf", "late", "addcol"):
        db.execute(f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 900, 3) g")
    db.execute("INSERT INTO filtered SELECT g, g * 10, 'hidden' FROM generate_series(1, 300) g")
    db.execute("INSERT INTO odd_key SELECT g, 'v' FROM generate_series(1, 200) g")  # int to text or numeric
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION pub_root FOR TABLE p_root WITH (publish_via_partition_root = true)")
    db.execute("CREATE PUBLICATION pub_rest FOR TABLE p_leaf, filtered (id, v) WHERE (id % 2 = 0), addcol, odd_key")
    db.execute("ALTER PUBLICATION pub_rest ADD TABLE late")  # after the slot
    out = tmp_path / "out"
    common = ["--slot", slot, "--output", str(out), "--publication", "pub_root,pub_rest"]
    stop = threading.Event()
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            _churn()
        except BaseException as exc:  # reported below
            failures.append(exc)

    def _churn() -> None:
        conn = db.connect()
        with conn.cursor() as cur:
            n = 0
            while not stop.is_set():
                n += 1  # a key moved across the partitions (and chunks) of a root published as one table
                cur.execute("UPDATE p_root SET id = id + 5000 WHERE id = (SELECT min(id) FROM p_root WHERE id < 400)")
                cur.execute("DELETE FROM p_leaf WHERE id = (SELECT min(id) FROM p_leaf)")
                cur.execute("INSERT INTO filtered VALUES (%s, 1, 'x')", (1000 + n,))
                cur.execute("UPDATE late SET v = 'changed' WHERE id = (SELECT max(id) FROM late WHERE v <> 'changed')")
                if n in (10, 40):  # a rewrite under the shared snapshot: that table is read again
                    cur.execute("VACUUM FULL late")
                time.sleep(0.02)
        conn.close()

    writer = threading.Thread(target=churn, daemon=True)
    writer.start()
    try:
        done = snapshot(db.dsn, *common, "--chunk-rows", "40")
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not failures, failures
    assert done.exit_code == 0, done.stderr
    assert ingest(db.dsn, *common, "--typed-tables").exit_code == 0
    db.execute("ALTER TABLE addcol ADD COLUMN d text DEFAULT 'dflt'")
    db.execute("INSERT INTO addcol VALUES (5000, 'new', 'given')")
    assert ingest(db.dsn, *common, "--typed-tables").exit_code == 0
    caplog.clear()
    code, _tables, err = materialize(str(out))
    assert code == 0, err
    assert "pgpoll snapshot --tables public.addcol" in caplog.text  # only a re-snapshot can fill the older rows
    assert snapshot(db.dsn, *common, "--tables", "public.addcol").exit_code == 0
    code, _tables, err = materialize(str(out))
    assert code == 0, err

    assert _state(spark, out, "p_root", ["id", "v"]) == _rows(db, "SELECT id, v FROM p_root")
    assert not (out / "state" / table_dir_name("public", "p_root_a")).exists()
    leaf = _state(spark, out, "p_leaf_a", ["id", "v"]) + _state(spark, out, "p_leaf_b", ["id", "v"])
    assert sorted(leaf) == _rows(db, "SELECT id, v FROM p_leaf")
    assert _state(spark, out, "filtered", ["id", "v"]) == _rows(db, "SELECT id, v FROM filtered WHERE id % 2 = 0")
    frame_columns = spark.read.parquet(str(out / "state" / table_dir_name("public", "filtered"))).columns
    assert "secret" not in frame_columns
    assert _state(spark, out, "late", ["id", "v"]) == _rows(db, "SELECT id, v FROM late")
    assert _state(spark, out, "addcol", ["id", "v", "d"]) == _rows(db, "SELECT id, v, d FROM addcol")
    odd = _state(spark, out, "odd_key", ["k", "v"])
    assert [(str(k), v) for k, v in odd] == sorted((str(k), v) for k, v in db.execute("SELECT k, v FROM odd_key"))
