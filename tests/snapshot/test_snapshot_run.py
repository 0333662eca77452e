"""``pgpoll snapshot`` against a real server and Spark: the format, typed values, resume, refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.sink.snapshot_store import SnapshotStore, latest_complete, table_lease
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.snapshot.chunk_task import PAUSE_ENV

REPO = Path(__file__).resolve().parents[2]

_TABLE = """CREATE TABLE public.t (id bigint PRIMARY KEY, n numeric(6,2), ts timestamptz, d date, tx text, b bytea,
                                  f float8, iv interval);
            -- no column can hold an out-of-line TOAST value: read in chunks (snapshot_catalog's rule)
            ALTER TABLE public.t ALTER COLUMN n SET STORAGE PLAIN, ALTER COLUMN tx SET STORAGE PLAIN,
                                 ALTER COLUMN b SET STORAGE PLAIN"""
_FILL = """INSERT INTO public.t SELECT i, CASE WHEN i %% 50 = 0 THEN 'NaN' ELSE i / 7.0 END,
             timestamptz '2024-01-01 00:00:00+00' + i * interval '1 hour 1.5 second',
             CASE WHEN i %% 40 = 0 THEN 'infinity'::date ELSE date '2020-02-29' + i END,
             repeat(md5(i::text), 1 + i %% 3), decode(md5(i::text), 'hex'), i / 3.0, i * interval '1 minute'
           FROM generate_series(%s, %s) i"""


def _run(dsn: str, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    result = CliRunner().invoke(cli, ["snapshot", *args], env={"PGPOLL_DSN": dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, json.loads(lines[-1]) if lines else None, result.stderr


def _setup(db: Any, tmp_path: Path, rows: int = 250) -> tuple[list[str], str]:
    db.require_plugin("pgoutput")
    db.execute(_TABLE)
    db.execute(_FILL, (1, rows))  # rows that existed before the slot
    db.execute("ANALYZE public.t")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE public.t")
    return ["--slot", slot, "--publication", "p", "--output", str(tmp_path / "out")], str(tmp_path / "out")


def _by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["id"]): r for r in rows}


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_rows_from_before_the_slot_land_in_the_format_with_the_typed_tables_values(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """The same chunks, read by the driver's threads (auto: Spark would be local here) or by Spark tasks."""
    monkeypatch.setenv("PGPOLL_SNAPSHOT_ENGINE", engine)
    args, out = _setup(db, tmp_path)
    db.execute(_FILL, (1001, 1120))  # after the slot: ingest --typed-tables writes these too
    code = CliRunner().invoke(cli, ["ingest", *args, "--typed-tables"], env={"PGPOLL_DSN": db.dsn}).exit_code
    assert code == 0
    code, summary, err = _run(db.dsn, *args, "--chunk-rows", "50", "--parallelism", "2")
    assert code == 0, err
    assert summary is not None and summary["status"] == "ok" and summary["rows"] == 370 and summary["chunks"] >= 3
    assert summary["engine"] == ("driver" if engine == "auto" else "spark")
    assert summary["tables"] == 1 and summary["exit_code"] == 0 and summary["bytes"] > 0
    found = latest_complete(open_output(out), "public", "t")
    assert found is not None and found.snapshot_id == summary["snapshot_id"]
    assert found.table["mode"] == "chunked" and found.table["key"] == ["id"]
    assert found.complete["convergence_lsn_int"] >= found.plan["plan_lsn_int"]
    assert sum(m["rows"] for m in found.manifests) == 370
    assert all(set(m["snapshot"]) >= {"xmin", "xmax", "xip"} for m in found.manifests)
    snapshot = pq.ParquetDataset(found.chunk_paths()).read().to_pylist()
    assert sorted(r["id"] for r in snapshot) == [*range(1, 251), *range(1001, 1121)]
    assert {r["_schema_id"] for r in snapshot} == {found.table["schema_id"]}
    typed_files = sorted((Path(out) / "tables" / "public.t").glob("lsn_range=*/*.parquet"))
    typed = _by_id([r for f in typed_files for r in pq.read_table(f).to_pylist()])
    snap = _by_id(snapshot)
    assert sorted(typed) == list(range(1001, 1121))
    for key, row in typed.items():  # value for value, fallbacks (NaN, infinity) included
        for name in ("id", "n", "ts", "d", "tx", "b", "f", "iv", "_untyped"):
            assert repr(snap[key][name]) == repr(row[name]), (key, name)
    plain = spark.read.parquet(*found.chunk_paths())  # a plain Spark read works
    assert plain.count() == 370


def test_an_interrupted_snapshot_resumes_reading_only_the_missing_chunks(db: Any, spark: Any, tmp_path: Path) -> None:
    args, out = _setup(db, tmp_path)
    code, first, err = _run(db.dsn, *args, "--chunk-rows", "20")
    assert code == 0 and first is not None, err
    total = first["chunks"]
    assert total >= 3
    store = SnapshotStore(open_output(out), first["snapshot_id"])
    # as a kill would leave it: two chunks unpublished, one published but not renamed, a stray attempt, no completion
    Path(store.meta("complete.json")).unlink()
    for n in (1, total - 1):
        Path(store.meta("public.t", f"chunk-{n:06d}.json")).unlink()
        Path(store.final_path("public.t", n)).unlink()
    manifest = json.loads(Path(store.meta("public.t", "chunk-000000.json")).read_text())
    attempt = Path(store.data("public.t", "_attempts", manifest["attempt"]))
    attempt.parent.mkdir(parents=True, exist_ok=True)
    Path(store.final_path("public.t", 0)).rename(attempt)
    stray = Path(store.data("public.t", "_attempts", "1-stray.parquet"))
    stray.write_bytes(b"half written")
    code, second, err = _run(db.dsn, *args, "--chunk-rows", "20")
    assert code == 0 and second is not None, err
    assert second["snapshot_id"] == first["snapshot_id"] and second["resumed"] is True
    assert second["chunks_read"] == 2 and second["rows"] == 250
    assert not stray.exists() and Path(store.final_path("public.t", 0)).exists()
    assert store.complete() is not None


def test_a_second_snapshot_of_the_same_table_exits_3_at_once_and_writes_nothing(db: Any, tmp_path: Path) -> None:
    args, out = _setup(db, tmp_path)
    other = table_lease(open_output(out), "public", "t", run="another-run", slot="s", enabled=True)
    other.acquire()
    code, summary, err = _run(db.dsn, *args)
    assert code == 3 and summary is not None and summary["status"] == "error", err
    assert "another snapshot run (another-run" in err
    assert not (Path(out) / "snapshots").exists() and not (Path(out) / "_pgpoll" / "snapshots").exists()


def test_a_small_snapshot_in_a_new_process_starts_no_jvm(db: Any, tmp_path: Path) -> None:
    """Spark would be local, so the driver reads the chunks itself: no JVM, no Spark worker (issue: about 12 s of
    an empty table's snapshot was Spark's start-up)."""
    args, _out = _setup(db, tmp_path, rows=0)
    env = dict(os.environ, PGPOLL_DSN=db.dsn)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    script = ("import sys\nfrom pgpoll.cli.main import main\n"
              "try:\n    main(sys.argv[1:])\n"
              "finally:\n    print('JVM' if 'pyspark.sql.session' in sys.modules and "
              "sys.modules['pyspark'].SparkContext._active_spark_context else 'NOJVM', file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", script, "snapshot", *args], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["engine"] == "driver" and summary["rows"] == 0 and summary["status"] == "ok"
    assert proc.stderr.strip().endswith("NOJVM"), proc.stderr[-2000:]


def test_an_unknown_snapshot_engine_is_a_usage_error(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args, out = _setup(db, tmp_path, rows=10)
    monkeypatch.setenv("PGPOLL_SNAPSHOT_ENGINE", "gpu")
    code, summary, err = _run(db.dsn, *args)
    assert summary is not None and summary["exit_code"] == 2
    assert code == 2 and "PGPOLL_SNAPSHOT_ENGINE" in err and "'gpu'" in err, err
    assert not list(Path(out).glob("_pgpoll/snapshots/*/complete.json"))


@pytest.mark.parametrize("extra", [["--tables", "public.nosuch"], ["--output", "hdfs://namenode:8020/x"]])
def test_an_unknown_table_or_an_unsupported_output_is_a_usage_error(db: Any, tmp_path: Path, extra: list[str]) -> None:
    args, out = _setup(db, tmp_path)
    code, summary, err = _run(db.dsn, *args, *extra)
    assert code == 2 and summary is not None and summary["exit_code"] == 2, err
    assert not (Path(out) / "_pgpoll" / "snapshots").exists()


def test_ctrl_c_stops_at_once_keeping_finished_chunks_and_the_rerun_reads_only_the_others(
    db: Any, spark: Any, tmp_path: Path
) -> None:
    args, out = _setup(db, tmp_path, rows=3_000)
    gate = tmp_path / "gate"  # (the chunk tasks wait for a go-ahead file each: PAUSE_ENV, tests only)
    gate.mkdir()
    env = dict(os.environ, PGPOLL_DSN=db.dsn, PYSPARK_PYTHON=sys.executable, **{PAUSE_ENV: str(gate)})
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "snapshot.py"), *args, "--chunk-rows", "50", "--parallelism", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        manifests = "_pgpoll/snapshots/*/public.t/chunk-*.json"  # checkout-paths: data
        for n in range(3):  # three chunks finish, the fourth waits: the stop lands in the middle of the table
            (gate / f"public.t.{n}.go").write_text("")
        while len(list(Path(out).glob(manifests))) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches every process of the job
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, stderr[-3000:])
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted" and summary["exit_code"] == 130 and summary["chunks_read"] >= 1
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    kept = len(list(Path(out).glob(manifests)))
    total = summary["chunks"]
    assert total >= 10 and 1 <= kept < total and not list(Path(out).glob("_pgpoll/snapshots/*/complete.json"))
    code, rerun, err = _run(db.dsn, *args, "--chunk-rows", "50", "--parallelism", "2")
    assert code == 0 and rerun is not None, err
    assert rerun["resumed"] is True and rerun["chunks_read"] == total - kept and rerun["rows"] == 3_000


def test_a_keyless_table_is_read_under_one_shared_snapshot_as_a_multiset(db: Any, spark: Any, tmp_path: Path) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE public.bag (v int, w text)")
    db.execute("ALTER TABLE public.bag REPLICA IDENTITY FULL")
    db.execute("INSERT INTO public.bag SELECT i % 7, 'x' FROM generate_series(1, 300) i")  # duplicates
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE public.bag")
    out = str(tmp_path / "out")
    code, summary, err = _run(db.dsn, "--slot", slot, "--publication", "p", "--output", out, "--chunk-rows", "100")
    assert code == 0 and summary is not None and summary["rows"] == 300, err
    found = latest_complete(open_output(out), "public", "bag")
    assert found is not None and found.table["mode"] == "shared" and found.table["key"] == []
    assert len({json.dumps(m["snapshot"], sort_keys=True) for m in found.manifests}) == 1  # one snapshot for all
    rows = pq.ParquetDataset(found.chunk_paths()).read().to_pylist()
    assert sorted((r["v"], r["w"]) for r in rows) == sorted((i % 7, "x") for i in range(1, 301))


def test_test_decoding_tables_with_a_client_side_row_filter(db: Any, spark: Any, tmp_path: Path) -> None:
    db.require_plugin("test_decoding")
    db.execute(_TABLE)
    db.execute(_FILL, (1, 250))
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    out = str(tmp_path / "out")
    code, summary, err = _run(db.dsn, "--slot", slot, "--output", out, "--tables", "public.t",
                              "--row-filter", "public.t: (id > 200 OR id = 7)")
    assert code == 0 and summary is not None and summary["rows"] == 51, err
    found = latest_complete(open_output(out), "public", "t")
    assert found is not None
    ids = sorted(r["id"] for r in pq.ParquetDataset(found.chunk_paths()).read().to_pylist())
    assert ids == [7, *range(201, 251)]
