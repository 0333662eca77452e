"""``pgpoll status`` against a real server, a real ingest run and a real invalidated slot."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pgpoll.cli import exitcodes
from pgpoll.lsn import Lsn
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, make_capture

STATUS_FIELDS = {
    "slot", "plugin", "database", "active", "active_pid", "wal_status", "safe_wal_size", "restart_lsn",
    "confirmed_flush_lsn", "current_lsn", "lag_bytes", "lag_seconds", "lag_basis", "checked_at", "alerts",
    "failover", "synced", "sync_ready", "invalidation_reason", "conflicting",  # None where the server lacks them
}
OUTPUT_FIELDS = {
    "output", "output_records", "output_rows", "high_water_mark", "last_commit_ts", "last_committed_at",
    "position", "position_bytes",
}


def status_json(pgpoll: Any, dsn: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``pgpoll status --json ARGS``: exit code, one dict per slot, stderr."""
    result = pgpoll("status", "--json", *args, env={"PGPOLL_DSN": dsn})
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, rows, result.stderr


def only(rows: list[dict[str, Any]], slot: str) -> dict[str, Any]:
    found = [r for r in rows if r["slot"] == slot]
    assert len(found) == 1, rows
    return found[0]


def load(db: Any, first: int, count: int) -> None:
    db.execute("INSERT INTO items SELECT g, repeat('x', 200) FROM generate_series(%s, %s) g", (first, first + count - 1))


@pytest.fixture
def pg_capture(db: Any, tmp_path: Path) -> Capture:
    return make_capture(db, "pgoutput", tmp_path / "out")


def test_lag_grows_under_load_and_shrinks_after_an_ingest_run(pg_capture: Capture, pgpoll: Any, spark: Any) -> None:
    db, slot = pg_capture.db, pg_capture.slot
    code, rows, _ = status_json(pgpoll, db.dsn, "--slot", slot)
    assert code == 0
    idle = only(rows, slot)["lag_bytes"]

    load(db, 0, 2000)
    _, rows, _ = status_json(pgpoll, db.dsn, "--slot", slot)
    loaded = only(rows, slot)["lag_bytes"]
    load(db, 2000, 2000)
    _, rows, _ = status_json(pgpoll, db.dsn, "--slot", slot)
    more = only(rows, slot)["lag_bytes"]
    assert idle < loaded < more
    assert more - idle > 2 * 2000 * 200  # two loads of 2000 rows of 200 bytes at least

    run = ingest(db.dsn, *pg_capture.args())
    assert run.exit_code == 0, run.stderr
    assert run.summary is not None and run.summary["changes"] == 4000

    code, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output)
    after = only(rows, slot)
    assert code == 0
    assert after["lag_bytes"] < loaded and after["lag_bytes"] < 64 * 1024
    assert after["position"] == "in_sync" and after["position_bytes"] == 0
    assert after["high_water_mark"] == after["confirmed_flush_lsn"] == confirmed_lsn(db, slot)
    assert after["output_rows"] == 4000
    assert after["last_commit_ts"] is not None
    assert 0 <= after["lag_seconds"] < 300


def _wait_for_counters(db: Any, table: str, inserts: int) -> None:
    """Until the server's cumulative statistics show ``inserts`` rows inserted into ``table`` (flushed about once a second)."""
    deadline = time.monotonic() + 20
    while db.execute("SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = %s", (table,))[0][0] < inserts:
        assert time.monotonic() < deadline, "the statistics never showed the insert"
        time.sleep(0.2)


def test_an_idle_source_that_caught_up_reports_no_lag_and_a_write_reports_its_age(
    pg_capture: Capture, pgpoll: Any, spark: Any
) -> None:
    db, slot = pg_capture.db, pg_capture.slot
    load(db, 0, 50)
    _wait_for_counters(db, "items", 50)
    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0

    time.sleep(1.5)  # idle: the old definition (now - newest commit time) would already report a growing lag
    code, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output)
    idle = only(rows, slot)
    assert code == 0 and idle["position"] == "in_sync"
    assert idle["lag_basis"] == "counters" and idle["lag_seconds"] == 0
    assert idle["lag_bytes"] < 16 * 1024  # the run ended by consuming its own heartbeat

    db.execute("INSERT INTO other VALUES (1, 'not captured')")  # another table: nothing captured is pending
    _wait_for_counters(db, "other", 1)
    _, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output)
    assert only(rows, slot)["lag_seconds"] == 0

    load(db, 50, 1)
    _wait_for_counters(db, "items", 51)
    time.sleep(1.0)
    _, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output)
    pending = only(rows, slot)
    assert pending["lag_basis"] == "counters" and pending["lag_seconds"] >= 1.0

    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0
    _, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output)
    assert only(rows, slot)["lag_seconds"] == 0


def test_json_has_every_field_and_reports_the_active_pid(db: Any, pgpoll: Any, tmp_path: Path, hold_slot: Any) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    other = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (other,))

    code, rows, _ = status_json(pgpoll, db.dsn)
    assert code == 0
    assert sorted(r["slot"] for r in rows) == sorted([cap.slot, other])  # every logical slot of this database
    row = only(rows, cap.slot)
    assert set(row) == STATUS_FIELDS
    assert row["plugin"] == "test_decoding" and row["database"] == db.name
    assert row["active"] is False and row["active_pid"] is None
    assert row["wal_status"] == "reserved" and row["safe_wal_size"] is None  # no max_slot_wal_keep_size
    assert isinstance(row["lag_bytes"], int) and row["lag_bytes"] >= 0
    assert row["lag_seconds"] is None  # no --output: no captured commit time to compare with
    assert Lsn.parse(row["current_lsn"]) >= Lsn.parse(row["confirmed_flush_lsn"])
    assert row["alerts"] == []

    pid = hold_slot(cap.slot)
    _, rows, _ = status_json(pgpoll, db.dsn, "--slot", cap.slot)
    assert len(rows) == 1 and rows[0]["active"] is True and rows[0]["active_pid"] == pid


def test_output_fields_come_from_the_commit_log(pg_capture: Capture, pgpoll: Any, spark: Any) -> None:
    db = pg_capture.db
    load(db, 0, 10)
    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0
    records = [json.loads(p.read_text()) for p in sorted(Path(pg_capture.output, "_pgpoll", "commits").glob("*.json"))]
    assert records

    code, rows, _ = status_json(pgpoll, db.dsn, "--output", pg_capture.output, "--slot", pg_capture.slot)

    assert code == 0 and len(rows) == 1
    row = rows[0]
    assert set(row) == STATUS_FIELDS | OUTPUT_FIELDS
    assert row["output_records"] == len(records)
    assert row["high_water_mark"] == str(max(Lsn.parse(r["end"]) for r in records))
    newest = max(r["last_commit_ts"] for r in records if r["last_commit_ts"])
    assert row["last_commit_ts"].replace("+00:00", "") == newest.replace("+00:00", "")


def test_the_text_table_shows_lag_time_and_position(pg_capture: Capture, pgpoll: Any, spark: Any) -> None:
    db = pg_capture.db
    load(db, 0, 10)
    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0

    result = pgpoll("status", "--output", pg_capture.output, env={"PGPOLL_DSN": db.dsn})

    assert result.exit_code == 0, result.stderr
    header, line = result.stdout.splitlines()
    assert header.split() == ["slot", "plugin", "active_pid", "wal_status", "safe_wal_size", "confirmed_lsn",
                              "lag_bytes", "lag_time", "high_water_mark", "position", "alerts"]
    assert line.split()[0] == pg_capture.slot and "unlimited" in line and "in_sync" in line
    lag_time = line[header.index("lag_time"):].split()[0]
    assert lag_time.endswith("s") and float(lag_time[:-1]) < 300  # e.g. 0.4s


def test_exit_7_when_the_lag_is_above_max_lag_bytes(pg_capture: Capture, pgpoll: Any) -> None:
    db, slot = pg_capture.db, pg_capture.slot
    load(db, 0, 1000)
    _, rows, _ = status_json(pgpoll, db.dsn, "--slot", slot)
    lag = only(rows, slot)["lag_bytes"]

    code, rows, stderr = status_json(pgpoll, db.dsn, "--slot", slot, "--max-lag-bytes", str(lag // 2))
    assert code == exitcodes.STATUS_ALERT == 7
    assert only(rows, slot)["alerts"] == ["lag"]  # the report is printed with the verdict
    assert f"slot {slot} is" in stderr and "above --max-lag-bytes" in stderr and "fix: run the ingest job" in stderr

    code, rows, _ = status_json(pgpoll, db.dsn, "--slot", slot, "--max-lag-bytes", str(lag * 100))
    assert code == 0 and only(rows, slot)["alerts"] == []


def test_exit_4_for_a_lost_slot(db: Any, pgpoll: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    status = db.lose_slot(cap.slot)
    assert status == "lost", f"could not invalidate the slot (wal_status {status})"

    code, rows, stderr = status_json(pgpoll, db.dsn, "--max-lag-bytes", "1")

    assert code == exitcodes.SOURCE == 4  # lost wins over the lag alert
    row = only(rows, cap.slot)
    assert row["wal_status"] == "lost" and "lost" in row["alerts"]
    assert f"slot(s) {cap.slot} lost the WAL" in stderr and "fix: recreate the slot" in stderr
    assert "pgpoll resync` on the same output" in stderr


def test_a_slot_moved_past_the_output_is_flagged(pg_capture: Capture, pgpoll: Any, spark: Any) -> None:
    db = pg_capture.db
    load(db, 0, 10)
    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0
    load(db, 10, 10)
    db.execute("SELECT 1 FROM pg_replication_slot_advance(%s, pg_current_wal_lsn())", (pg_capture.slot,))

    code, rows, stderr = status_json(pgpoll, db.dsn, "--output", pg_capture.output, "--max-lag-bytes", "0")

    assert code == exitcodes.SOURCE == 4  # the gap is a source alert: it wins over the lag alert's 7
    row = only(rows, pg_capture.slot)
    assert row["position"] == "slot_ahead_of_output" and row["position_bytes"] > 0
    assert "slot_ahead_of_output" in row["alerts"]
    assert f"past the output's high-water mark {row['high_water_mark']}" in stderr and "fix: run `pgpoll resync" in stderr


def test_output_without_records_needs_slot(db: Any, pgpoll: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")

    code, _, stderr = status_json(pgpoll, db.dsn, "--output", cap.output)
    assert code == exitcodes.USAGE and "pass --slot NAME together with --output" in stderr

    code, rows, _ = status_json(pgpoll, db.dsn, "--output", cap.output, "--slot", cap.slot)
    assert code == 0 and rows[0]["position"] == "no_commits" and rows[0]["output_records"] == 0


def test_a_missing_slot_exits_4(db: Any, pgpoll: Any) -> None:
    code, rows, stderr = status_json(pgpoll, db.dsn, "--slot", "no_such_slot")
    assert code == 4 and rows == [] and 'replication slot "no_such_slot" does not exist' in stderr


def test_status_with_output_starts_no_spark(pg_capture: Capture, spark: Any) -> None:
    db = pg_capture.db
    load(db, 0, 10)
    assert ingest(db.dsn, *pg_capture.args()).exit_code == 0
    script = textwrap.dedent(
        """
        import json, sys, psutil
        from click.testing import CliRunner
        from pgpoll.cli.main import cli
        result = CliRunner().invoke(cli, sys.argv[1:])
        spark = sys.modules.get("pyspark")
        print(json.dumps({
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "children": [p.name() for p in psutil.Process().children(recursive=True)],
            "spark_context": bool(spark and spark.SparkContext._active_spark_context),
        }))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "status", "--json", "--dsn", db.dsn, "--output", pg_capture.output],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["exit_code"] == 0 and json.loads(seen["stdout"])["position"] == "in_sync"
    assert seen["children"] == [] and seen["spark_context"] is False  # no JVM was started


def test_an_output_that_cannot_be_read_without_spark_exits_5(db: Any, pgpoll: Any) -> None:
    code, rows, stderr = status_json(pgpoll, db.dsn, "--output", "nosuchscheme://bucket/path", "--slot", "any_slot")
    assert code == exitcodes.SINK == 5 and rows == []
    assert "cannot open output 'nosuchscheme://bucket/path' without Spark" in stderr and "fix: use a local path" in stderr


def test_a_login_role_without_replication_can_run_status(pg_capture: Capture, pgpoll: Any, make_role: Any) -> None:
    monitor = make_role()  # LOGIN only: no REPLICATION, no table privileges
    code, rows, stderr = status_json(pgpoll, monitor.dsn, "--slot", pg_capture.slot)
    assert code == 0, stderr
    assert rows[0]["slot"] == pg_capture.slot and rows[0]["wal_status"] == "reserved"
