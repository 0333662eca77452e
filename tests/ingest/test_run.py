"""The ingest run end to end on a real PostgreSQL and a real local Spark."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, make_capture, read_output


def test_changes_land_once_with_the_envelope_and_the_slot_moves_to_the_last_commit(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items VALUES (1, 'a'), (2, NULL)")
    db.execute("UPDATE items SET v = 'b' WHERE id = 1")
    db.execute("DELETE FROM items WHERE id = 2")
    db.execute("TRUNCATE items")

    result = ingest(db.dsn, *capture.args())

    assert result.exit_code == 0, result.stderr
    summary = result.summary
    assert summary is not None
    assert summary["status"] == "ok" and summary["changes"] == 5 and summary["plugin"] == capture.plugin
    rows = read_output(spark, capture.output)
    assert [(r["op"], r["table_name"]) for r in rows] == [("I", "items")] * 2 + [("U", "items"), ("D", "items"), ("T", "items")]
    first_txn = [r for r in rows if r["commit_lsn"] == rows[0]["commit_lsn"]]
    assert [r["seq"] for r in first_txn] == [0, 1]
    assert dict(rows[0]["after"]) == {"id": "1", "v": "a"} and dict(rows[1]["after"]) == {"id": "2", "v": None}
    assert dict(rows[2]["after"]) == {"id": "1", "v": "b"}
    assert dict(rows[3]["before"]) == {"id": "2"}
    assert all(r["schema_name"] == "public" and r["xid"] and r["commit_ts"] is not None for r in rows)
    commit_lsns = [r["commit_lsn"] for r in rows]
    assert commit_lsns == sorted(commit_lsns) and len(set(commit_lsns)) == 4
    # the slot sits exactly where the output ends: the last COMMIT the run saw
    assert Lsn.parse(confirmed_lsn(db, capture.slot)) == Lsn.parse(summary["last_lsn"])
    assert Lsn.parse(summary["last_lsn"]) >= Lsn(max(commit_lsns))


def test_each_partition_is_named_by_the_lsn_range_it_holds(capture: Capture, spark: Any) -> None:
    db = capture.db
    for i in range(6):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 10, i * 10 + 9))

    result = ingest(db.dsn, *capture.args("--batch-changes", "20"))

    assert result.exit_code == 0, result.stderr
    assert result.summary and result.summary["batches"] >= 3
    rows = read_output(spark, capture.output)
    assert sorted(r["after"]["id"] for r in rows) == sorted(str(i) for i in range(60))
    parts = sorted(p.name for p in (Path(capture.output) / "changes").glob("lsn_range=*"))
    assert len(parts) >= 3
    for row in rows:
        start, end = row["lsn_range"].split("-")
        assert int(start, 16) <= row["commit_lsn"] <= int(end, 16)
    ranges = [tuple(int(x, 16) for x in p.split("=")[1].split("-")) for p in parts]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), "ranges overlap or are out of order"


def test_limits_stop_early_and_the_next_run_continues_without_loss(capture: Capture, spark: Any) -> None:
    db = capture.db
    for i in range(5):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 10, i * 10 + 9))

    first = ingest(db.dsn, *capture.args("--batch-changes", "15", "--max-batches", "1"))
    assert first.exit_code == 0 and first.summary and first.summary["batches"] == 1
    assert len(read_output(spark, capture.output)) < 50

    second = ingest(db.dsn, *capture.args())
    assert second.exit_code == 0, second.stderr
    rows = read_output(spark, capture.output)
    assert sorted(int(r["after"]["id"]) for r in rows) == list(range(50))


def test_a_run_with_nothing_new_writes_nothing_and_exits_0(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(db.dsn, *capture.args()).exit_code == 0
    again = ingest(db.dsn, *capture.args())
    assert again.exit_code == 0 and again.summary and again.summary["changes"] == 0
    assert len(read_output(spark, capture.output)) == 1


def test_read_changes_and_a_plain_parquet_read_see_the_same_changes(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 30) g")
    assert ingest(db.dsn, *capture.args("--batch-changes", "10")).exit_code == 0
    db.execute("UPDATE items SET v = 'y' WHERE id < 5")
    assert ingest(db.dsn, *capture.args()).exit_code == 0

    plain = read_output(spark, capture.output)
    through_log = [r.asDict(recursive=True) for r in read_changes(spark, capture.output).orderBy("commit_lsn", "seq").collect()]
    key = lambda r: (r["commit_lsn"], r["seq"])  # noqa: E731
    assert sorted(map(key, plain)) == sorted(map(key, through_log))
    assert len(set(map(key, plain))) == len(plain) == 34


def test_commit_log_records_every_batch(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 30) g")
    result = ingest(db.dsn, *capture.args())
    assert result.exit_code == 0
    records = [json.loads(p.read_text()) for p in sorted((Path(capture.output) / "_pgpoll" / "commits").glob("*.json"))]
    assert records, "no commit-log record"
    last = records[-1]
    assert last["slot"] == capture.slot and last["plugin"] == capture.plugin
    assert last["end"] == result.summary["last_lsn"]  # type: ignore[index]
    assert sum(r["rows"] for r in records) == 30
    newest = max(r["commit_ts"] for r in read_output(spark, capture.output))  # naive, in the session's UTC
    last = max(datetime.fromisoformat(r["last_commit_ts"]) for r in records if r["rows"])
    assert last.tzinfo is not None and last.replace(tzinfo=None) == newest
    for rec in records:
        if rec["partition"]:
            names = {p.name for p in (Path(capture.output) / "changes" / rec["partition"]).glob("part-*")}
            assert names == set(rec["files"])


def test_table_patterns_keep_and_leave_out_tables(db: Any, tmp_path: Path, spark: Any) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    db.execute("INSERT INTO other VALUES (1, 'a')")
    assert ingest(db.dsn, *cap.args("--tables", "public.items")).exit_code == 0
    assert {r["table_name"] for r in read_output(spark, cap.output)} == {"items"}

    cap2 = make_capture_second(db, tmp_path / "out2")
    db.execute("INSERT INTO items VALUES (2, 'b')")
    db.execute("INSERT INTO other VALUES (2, 'b')")
    assert ingest(db.dsn, "--slot", cap2, "--output", str(tmp_path / "out2"), "--exclude-tables", "*.items").exit_code == 0
    assert {r["table_name"] for r in read_output(spark, str(tmp_path / "out2"))} == {"other"}


def make_capture_second(db: Any, output: Path) -> str:
    """A second test_decoding slot on the same database."""
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    return slot


def test_the_slot_is_advanced_only_to_commit_row_lsns(capture: Capture) -> None:
    db = capture.db
    witness = db.slot_name("w")
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (witness,))
    db.execute("INSERT INTO items VALUES (1, 'a')")
    db.execute("BEGIN; INSERT INTO items VALUES (2, 'b'); INSERT INTO items VALUES (3, 'c'); COMMIT")
    result = ingest(db.dsn, *capture.args("--batch-changes", "3"))
    assert result.exit_code == 0, result.stderr
    commits = {
        Lsn.parse(lsn)
        for lsn, data in db.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (witness,)
        )
        if data.startswith("COMMIT")
    }
    assert Lsn.parse(confirmed_lsn(db, capture.slot)) in commits


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_heavy_uncaptured_traffic_does_not_pin_wal(db: Any, tmp_path: Path, plugin: str) -> None:
    cap = make_capture(db, plugin, tmp_path / "out")
    # pgoutput: 'other' is not in the publication; test_decoding: --tables leaves it out
    db.execute("INSERT INTO other SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    extra = ("--tables", "public.items") if plugin == "test_decoding" else ()
    before = db.execute("SELECT pg_current_wal_lsn()::text")[0][0]
    result = ingest(db.dsn, *cap.args(*extra))
    assert result.exit_code == 0, result.stderr
    after_run = db.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
        "pg_wal_lsn_diff(confirmed_flush_lsn, %s::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
        (before, cap.slot),
    )[0]
    lag, moved_past_traffic = after_run
    assert moved_past_traffic > 0, "the slot did not move past the uncaptured traffic"
    assert lag < 1024, f"confirmed_flush is {lag} bytes behind the WAL end (more than one heartbeat)"


def test_pyarrow_and_duckdb_read_the_output_as_a_partitioned_dataset(capture: Capture, spark: Any) -> None:
    import duckdb
    import pyarrow.dataset as ds

    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 25) g")
    assert ingest(db.dsn, *capture.args("--batch-changes", "10")).exit_code == 0
    changes = Path(capture.output) / "changes"
    spark_rows = {(r["commit_lsn"], r["seq"], r["lsn_range"]) for r in read_output(spark, capture.output)}

    table = ds.dataset(changes, format="parquet", partitioning="hive").to_table()
    assert {(r["commit_lsn"], r["seq"], r["lsn_range"]) for r in table.to_pylist()} == spark_rows

    con = duckdb.connect()
    duck = con.execute(
        "SELECT commit_lsn, seq, lsn_range FROM read_parquet(?, hive_partitioning = true)",
        [str(changes / "*" / "*.parquet")],
    ).fetchall()
    assert set(duck) == spark_rows and len(duck) == 25


def test_booleans_land_as_true_and_false_from_both_plugins(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("ALTER TABLE items ADD COLUMN ok boolean")
    db.execute("INSERT INTO items VALUES (1, 'a', true), (2, 'b', false), (3, 'c', NULL)")
    assert ingest(db.dsn, *capture.args()).exit_code == 0
    rows = read_output(spark, capture.output)
    assert [dict(r["after"])["ok"] for r in rows] == ["true", "false", None]
