"""SIGINT and SIGTERM: a clean stop (summary line, exit 130 or 143, no traceback), then nothing lost or twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ingest.conftest import REPO, Capture, _summary, confirmed_lsn, ingest, make_capture, read_output


def _start(capture: Capture, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PGPOLL_DSN=capture.db.dsn, PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "ingest.py"), *capture.args(*extra)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _wait_until_peeking(capture: Capture, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until the slot is active: a batch task is peeking (the run is inside its first batch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        active = capture.db.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (capture.slot,)
        )[0][0]
        if active:
            return
        time.sleep(0.05)
    raise AssertionError("the run never started peeking")


@pytest.mark.parametrize(("signum", "to_group", "code"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)])
def test_a_signal_mid_batch_stops_cleanly_and_a_rerun_takes_every_change_once(
    db: Any, tmp_path: Path, spark: Any, signum: int, to_group: bool, code: int
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    # batch 1 is the first transaction alone (it passes --batch-changes), and commits; batch 2 is cut short
    db.execute("INSERT INTO items SELECT g, 'a' FROM generate_series(1, 3000) g")
    db.execute("INSERT INTO items SELECT g, repeat('x', 50) FROM generate_series(3001, 301000) g")
    proc = _start(capture, "--batch-changes", "2000")
    try:
        deadline = time.monotonic() + 180
        # wait for the first batch's commit (the slot moves), then for the second batch's peek
        start_lsn = confirmed_lsn(db, capture.slot)
        while confirmed_lsn(db, capture.slot) == start_lsn and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        _wait_until_peeking(capture, proc)
        time.sleep(0.5)
        if to_group:
            os.killpg(proc.pid, signum)  # Ctrl-C in a terminal reaches every process of the job
        else:
            os.kill(proc.pid, signum)  # `kill PID`, as a scheduler stops a job
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, (proc.returncode, err[-3000:])
    summary = _summary(out)
    assert summary is not None and summary["status"] == "interrupted" and summary["exit_code"] == code, out[-2000:]
    assert summary["batches"] >= 1  # the batch committed before the signal stays committed
    assert "Traceback" not in out + err, (out + err)[-4000:]
    assert not [line for line in (out + err).splitlines() if line.startswith("\tat ") or " ERROR " in line], err[-4000:]
    assert "interrupted by signal" in err

    rerun = ingest(db.dsn, *capture.args("--batch-changes", "400000"))
    assert rerun.exit_code == 0, rerun.stderr
    ids = [int(r["after"]["id"]) for r in read_output(spark, capture.output) if r["op"] == "I"]
    assert len(ids) == 301000 and sorted(ids) == list(range(1, 301001))


def test_sigint_during_materialize_stops_cleanly_and_a_rerun_builds_the_whole_state(
    db: Any, tmp_path: Path, spark: Any
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, repeat('x', 30) FROM generate_series(1, 200000) g")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "materialize.py"), "--output", capture.output, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    lease = Path(capture.output) / "state" / ".pgpoll-materialize.lease"
    try:
        deadline = time.monotonic() + 180
        while not lease.exists():  # the run holds its destination: it is materializing
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "materialize never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    summary = _summary(out)
    assert summary is not None and summary["status"] == "interrupted" and summary["exit_code"] == 130, out
    assert "Traceback" not in out + err and not [line for line in err.splitlines() if " ERROR " in line], err[-3000:]
    assert not lease.exists()  # released on the way out: the next run is not refused

    from tests.materialize.conftest import materialize, state_rows

    code, tables, _err = materialize(capture.output)
    assert code == 0 and [t["rows"] for t in tables] == [200000]
    assert len(state_rows(spark, capture.output, "public", "items")) == 200000
