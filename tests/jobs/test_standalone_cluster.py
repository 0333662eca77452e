"""The ingest job on a real Spark standalone cluster, with pgpoll shipped only as ``make dist``'s zip, writing to S3.

The master and the worker come from the pyspark package (``spark-class``) and
listen on 127.0.0.1. The driver and the executor run a Python that has
pgpoll's dependencies but not pgpoll; spark-submit runs outside the repository
with ``PYTHONPATH`` cleared, so ``--py-files dist/pgpoll.zip`` is the only
place pgpoll can come from. The output is on a real S3 store (SeaweedFS) and
no Hadoop S3 connector is on the classpath: the executor uploads the batch
and the driver commits it through pgpoll's own client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes_arrow
from pgpoll.testing.object_stores import StoreBucket
from tests.ingest.conftest import REPO, confirmed_lsn, make_capture
from tests.jobs.standalone import SPARK_HOME, StandaloneCluster, deps_only_python, spark_env

pytestmark = pytest.mark.spark_cluster


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make dist`` into a temporary directory (with this interpreter; the venv is not remade)."""
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    proc = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "dist", f"DIST={out}", f"PY={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 600
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master and worker, always stopped afterwards."""
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark"))
    try:
        yield standalone.start()
    finally:
        standalone.stop()


def test_make_dist_builds_a_wheel_a_py_files_zip_and_the_entry_script(dist: Path) -> None:
    wheels = list(dist.glob("pgpoll-*-py3-none-any.whl"))
    assert len(wheels) == 1
    assert (dist / "pgpoll.zip").read_bytes() == wheels[0].read_bytes()
    assert (dist / "ingest.py").read_text() == (REPO / "jobs" / "ingest.py").read_text()
    assert (dist / "materialize.py").read_text() == (REPO / "jobs" / "materialize.py").read_text()
    import zipfile

    names = set(zipfile.ZipFile(dist / "pgpoll.zip").namelist())
    assert {"pgpoll/__init__.py", "pgpoll/cli/main.py", "pgpoll/ingest/task.py", "pgpoll/decode/pgoutput_decoder.py"} <= names


def test_ingest_job_runs_on_a_standalone_cluster_from_the_dist_zip(
    db: Any, tmp_path: Path, dist: Path, cluster: StandaloneCluster, s3_bucket: StoreBucket
) -> None:
    assert not list((SPARK_HOME / "jars").glob("hadoop-aws*")) and not list((SPARK_HOME / "jars").glob("*aws-java-sdk*"))
    worker_python = deps_only_python(tmp_path / "worker-python")
    probe = subprocess.run(
        [str(worker_python), "-c", "import psycopg2, pyarrow, tenacity, pyspark\nimport pgpoll"],
        capture_output=True, text=True, cwd=tmp_path, env=spark_env(cluster.conf_dir), timeout=120,
    )
    assert "No module named 'pgpoll'" in probe.stderr, probe.stderr  # the dependencies are there, pgpoll is not

    cap = make_capture(db, "pgoutput", s3_bucket.child("out"))  # type: ignore[arg-type]
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")
    db.execute("UPDATE items SET v = 'changed' WHERE id <= 10")
    db.execute("DELETE FROM items WHERE id > 490")
    db.execute("INSERT INTO other VALUES (1, 'not published')")

    run_dir = tmp_path / "submit"  # outside the repository
    run_dir.mkdir()
    env = spark_env(
        cluster.conf_dir, PYSPARK_PYTHON=str(worker_python), PYSPARK_DRIVER_PYTHON=str(worker_python), PGPOLL_DSN=db.dsn,
        PGPOLL_DRIVER_BATCH_WAL="0",  # every batch a Spark job: this small backlog would otherwise run in the driver
    )
    proc = subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url,
            "--py-files", str(dist / "pgpoll.zip"),
            "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
            "--conf", "spark.cores.max=1", "--driver-memory", "512m",
            str(dist / "ingest.py"), *cap.args(),
        ],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=600,
    )

    assert proc.returncode == 0, proc.stderr[-5000:]
    # spark-submit merges the Python driver's stderr into its stdout: the summary is the last JSON line, not the last line
    summary = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["status"] == "ok" and summary["changes"] == 500 + 10 + 10
    assert summary["spark_jobs"] >= 1 and summary["fenced"] is True
    table = read_changes_arrow(cap.output)
    ops = table.column("op").to_pylist()
    assert (ops.count("I"), ops.count("U"), ops.count("D")) == (500, 10, 10)
    assert set(table.column("table_name").to_pylist()) == {"items"}
    assert Lsn.parse(confirmed_lsn(db, cap.slot)) == Lsn.parse(summary["last_lsn"])

    # the batch task ran in an executor of this cluster's worker, which fetched the zip
    state = cluster.state() or {}
    apps = [a for a in state.get("completedapps", []) + state.get("activeapps", []) if a.get("name") == "pgpoll-ingest"]
    assert len(apps) == 1, state
    executor_dirs = list((cluster.work_dir / apps[0]["id"]).iterdir())
    assert executor_dirs and all((d / "pgpoll.zip").exists() for d in executor_dirs)
