"""Progress inside a batch: the task's side channel reaches the driver while the batch runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from pgpoll.ingest.progress_channel import BatchProgress, BatchProgressLog, ProgressListener, ProgressReporter
from pgpoll.ingest.run import IngestOptions, run_ingest
from tests.ingest.conftest import make_capture


def _wait(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_reporter_lines_reach_the_listener_for_the_current_batch_only() -> None:
    seen: list[BatchProgress] = []
    lock = threading.Lock()

    def record(p: BatchProgress) -> None:
        with lock:
            seen.append(BatchProgress(p.batch, p.phase, p.rows, p.changes))

    listener = ProgressListener("127.0.0.1", record)
    try:
        listener.start_batch(2)
        stale = ProgressReporter(listener.address, batch=1)
        stale.report("fetch", 5, 5, force=True)  # a previous batch's task: ignored
        reporter = ProgressReporter(listener.address, batch=2)
        reporter.report("server", force=True)
        reporter.report("fetch", 100, 90, force=True)
        _wait(lambda: len(seen) >= 2)
        assert [(p.phase, p.rows, p.changes) for p in seen] == [("server", 0, 0), ("fetch", 100, 90)]
        assert all(p.batch == 2 for p in seen)
        reporter.close()
        stale.close()
    finally:
        listener.close()


def test_a_line_without_the_runs_token_is_ignored() -> None:
    seen: list[BatchProgress] = []
    listener = ProgressListener("127.0.0.1", seen.append)
    try:
        listener.start_batch(1)
        from pgpoll.ingest.progress_channel import ChannelAddress

        forged = ProgressReporter(ChannelAddress("127.0.0.1", listener.address.port, "not-the-token"), batch=1)
        forged.report("fetch", 1, 1, force=True)
        good = ProgressReporter(listener.address, batch=1)
        good.report("fetch", 7, 7, force=True)
        _wait(lambda: len(seen) >= 1)
        time.sleep(0.2)
        assert [p.rows for p in seen] == [7]
    finally:
        listener.close()


def test_an_unreachable_driver_leaves_the_task_silent_not_failing() -> None:
    listener = ProgressListener("127.0.0.1", lambda p: None)
    address = listener.address
    listener.close()
    reporter = ProgressReporter(address, batch=1)
    assert not reporter.connected  # nobody listens: the reporter is off, not failing
    reporter.report("fetch", 1, 1, force=True)  # must not raise
    assert not reporter.connected
    reporter.close()


def test_cron_mode_logs_long_batches_at_most_every_interval(caplog: Any) -> None:
    show = BatchProgressLog(None, every=30.0)
    progress = BatchProgress(3, "fetch", 10, 10, started=time.monotonic() - 31)
    with caplog.at_level("INFO", logger="pgpoll.ingest"):
        show(progress)
        show(progress)  # within the same 30 s: no second line
        short = BatchProgress(4, "fetch", 10, 10)
        show(short)  # a short batch stays quiet
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("batch 3: 10 rows fetched"), lines


def test_a_real_batch_reports_the_servers_phase_then_rows_while_it_runs(db: Any, tmp_path: Path, spark: Any) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, repeat('x', 20) FROM generate_series(1, 60000) g")
    lines: list[str] = []
    summary = run_ingest(
        IngestOptions(slot=capture.slot, output=capture.output, publications=("pub_items",), dsn=db.dsn),
        spark=spark, show_progress=lines.append,
    )
    assert summary.changes == 60000
    assert any("the server is decoding" in line for line in lines), lines
    fetched = [line for line in lines if "rows fetched" in line]
    # batch 1's last line counts every peeked row (60,003 with Relation, Begin and Commit); batch 2 is the heartbeat
    assert any(line.startswith("batch 1: 60,00") for line in fetched), lines
