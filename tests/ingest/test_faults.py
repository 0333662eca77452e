"""Crashes, restarts and races: every source change lands in the output exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgpoll.faults import FAULT_EXIT, POINTS
from tests.ingest.conftest import REPO, Capture, ingest, ingest_process, read_output


def _ids(spark: Any, capture: Capture) -> list[int]:
    return sorted(int(r["after"]["id"]) for r in read_output(spark, capture.output) if r["op"] == "I")


#: Batches cut by a row count, by a WAL budget smaller than a transaction (bounded peeks that find nothing,
#: then a doubled budget), and the defaults (one batch that takes the end-of-run heartbeat in).
BATCHING = {"rows": ("--batch-changes", "30"), "wal": ("--batch-wal", "2kB"), "defaults": ()}


@pytest.mark.parametrize("batching", sorted(BATCHING))
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_each_point_then_a_rerun_loses_and_duplicates_nothing(
    capture: Capture, spark: Any, point: str, batching: str
) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'a' FROM generate_series(1, 40) g")
    db.execute("INSERT INTO items SELECT g, 'b' FROM generate_series(41, 60) g")
    args = capture.args(*BATCHING[batching])

    crashed = ingest_process(db.dsn, *args, env={"PGPOLL_FAULT": point})
    assert crashed.exit_code == FAULT_EXIT, (crashed.exit_code, crashed.stderr[-2000:])
    assert f"PGPOLL_FAULT={point}" in crashed.stderr

    db.execute("INSERT INTO items SELECT g, 'c' FROM generate_series(61, 70) g")
    rerun = ingest(db.dsn, *args)
    assert rerun.exit_code == 0, rerun.stderr
    assert _ids(spark, capture) == list(range(1, 71))


def test_a_loop_of_sigkills_then_a_clean_run_loses_and_duplicates_nothing(capture: Capture, spark: Any) -> None:
    db = capture.db
    rng = random.Random(20261122)
    env = dict(os.environ, PGPOLL_DSN=db.dsn, PYSPARK_PYTHON=sys.executable)
    next_id = 1
    for _round in range(3):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (next_id, next_id + 199))
        next_id += 200
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "jobs" / "ingest.py"), *capture.args("--batch-changes", "50")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        time.sleep(rng.uniform(4.0, 14.0))
        os.killpg(proc.pid, signal.SIGKILL)  # the job and its Spark JVM, at once
        proc.wait()
    final = ingest(db.dsn, *capture.args("--batch-changes", "50"))
    assert final.exit_code == 0, final.stderr
    assert _ids(spark, capture) == list(range(1, next_id))


def test_three_runs_started_together_one_consumes_two_exit_3(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 100) g")
    env = dict(os.environ, PGPOLL_DSN=db.dsn, PYSPARK_PYTHON=sys.executable)
    procs = [
        subprocess.Popen([sys.executable, str(REPO / "jobs" / "ingest.py"), *capture.args()],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    # A run whose batches run in the driver can be over in about a second: a run that starts after it
    # finished takes the free lease and finds nothing new. Either way no change is written twice.
    assert codes[0] == 0 and set(codes) <= {0, 3}, [o[1][-500:] for o in outputs]
    written = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if proc.returncode == 3:
            assert "another ingest run" in err and "holds the output" in err
            assert "incubator modules" not in err  # a local output's lease is refused before Spark starts
        else:
            summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
            written.append(summary["changes"])
    assert sorted(written)[-1] == 100 and sum(written) == 100  # one run consumed everything, any other nothing
    assert _ids(spark, capture) == list(range(1, 101))


def _run_in_thread(dsn: str, args: list[str]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        box["result"] = ingest(dsn, *args)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


def _wait_for_commits(output: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    commits = Path(output) / "_pgpoll" / "commits"
    while time.monotonic() < deadline:
        if commits.exists() and len(list(commits.glob("*.json"))) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {count} commit(s) within {timeout}s")


def test_a_server_crash_mid_run_is_retried_and_nothing_is_lost(db: Any, tmp_path: Path, spark: Any) -> None:
    from tests.ingest.conftest import make_capture

    capture = make_capture(db, "pgoutput", tmp_path / "out")
    for i in range(20):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 500 + 1, i * 500 + 500))
    thread, box = _run_in_thread(db.dsn, capture.args("--batch-changes", "1100"))
    _wait_for_commits(capture.output, 1)
    db.server.restart(mode="immediate")
    thread.join(timeout=600)
    result = box["result"]
    assert result.exit_code == 0, result.stderr
    assert _ids(spark, capture) == list(range(1, 10001))


def test_terminating_the_jobs_backend_is_retried_and_nothing_is_lost(db: Any, tmp_path: Path, spark: Any) -> None:
    from tests.ingest.conftest import make_capture

    capture = make_capture(db, "test_decoding", tmp_path / "out")
    for i in range(20):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 500 + 1, i * 500 + 500))
    thread, box = _run_in_thread(db.dsn, capture.args("--batch-changes", "1100"))
    _wait_for_commits(capture.output, 1)
    terminated = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'pgpoll ingest%%'"
    )[0][0]
    thread.join(timeout=600)
    result = box["result"]
    assert terminated >= 1
    assert result.exit_code == 0, result.stderr
    assert _ids(spark, capture) == list(range(1, 10001))
