"""Small batches run in the driver, with no Spark job: same output, and a run that finds little starts no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from pgpoll.errors import ConfigError
from pgpoll.ingest.batch_job import DRIVER_BATCH_ENV, DRIVER_BATCH_WAL, EVERY_BATCH, driver_batch_wal
from tests.ingest.conftest import confirmed_lsn, ingest, ingest_process

KEPT = ("op", "schema_name", "table_name", "commit_lsn", "seq", "xid", "commit_ts", "before", "after")


def _changes(output: Path) -> list[dict[str, Any]]:
    table = ds.dataset(output / "changes", format="parquet", partitioning="hive").to_table()
    table = table.sort_by([("commit_lsn", "ascending"), ("seq", "ascending")])
    return [{k: row[k] for k in KEPT} for row in table.to_pylist()]


def test_a_batch_in_the_driver_writes_what_a_spark_job_writes(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text, t timestamptz)")
    db.execute("CREATE PUBLICATION pub_items FOR TABLE items")
    slots = [db.slot_name(), db.slot_name()]
    for slot in slots:
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO items SELECT g, 'v' || g, '2024-06-01 12:00:50+02' FROM generate_series(1, 300) g")
    db.execute("UPDATE items SET v = NULL WHERE id % 7 = 0")
    db.execute("DELETE FROM items WHERE id > 290")
    db.execute("TRUNCATE items")
    db.execute("INSERT INTO items VALUES (1, 'again', NULL)")

    in_driver = ingest(db.dsn, "--slot", slots[0], "--publication", "pub_items", "--output", str(tmp_path / "a"),
                       "--typed-tables")
    monkeypatch.setenv(DRIVER_BATCH_ENV, "0")  # every batch a Spark job
    in_spark = ingest(db.dsn, "--slot", slots[1], "--publication", "pub_items", "--output", str(tmp_path / "b"),
                      "--typed-tables")

    assert in_driver.exit_code == 0 and in_spark.exit_code == 0, in_driver.stderr + in_spark.stderr
    assert in_driver.summary and in_spark.summary
    assert in_driver.summary["spark_jobs"] == 0 and in_spark.summary["spark_jobs"] >= 1
    assert in_driver.summary["changes"] == in_spark.summary["changes"] == 300 + 300 // 7 + 10 + 1 + 1
    assert _changes(tmp_path / "a") == _changes(tmp_path / "b")
    typed = [sorted(p.name for p in (tmp_path / out / "tables" / "public.items").iterdir()) for out in ("a", "b")]
    # the same batches (the second run's last one ends later: it also consumes the first run's heartbeat)
    assert [p.split("-")[0] for p in typed[0]] == [p.split("-")[0] for p in typed[1]] != []
    assert confirmed_lsn(db, slots[0]) == in_driver.summary["last_lsn"]


def test_a_run_with_little_to_do_starts_no_spark(db: Any, tmp_path: Path) -> None:
    """With Spark made unable to start, a run on a small backlog still drains it (and a second, empty run too)."""
    db.require_plugin("test_decoding")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 50) g")
    no_spark = {"SPARK_HOME": str(tmp_path / "no-spark-here")}
    args = ("--slot", slot, "--output", str(tmp_path / "out"))

    first = ingest_process(db.dsn, *args, env=no_spark)
    second = ingest_process(db.dsn, *args, env=no_spark)

    assert first.exit_code == 0, first.stderr
    assert second.exit_code == 0, second.stderr
    assert first.summary and first.summary["changes"] == 50 and first.summary["spark_jobs"] == 0
    assert second.summary and second.summary["changes"] == 0 and second.summary["spark_jobs"] == 0
    assert sorted(int(dict(r["after"])["id"]) for r in _changes(tmp_path / "out")) == list(range(1, 51))
    # and Spark really is unavailable there: a batch that needs a Spark job fails
    db.execute("INSERT INTO items VALUES (51, 'y')")
    failed = ingest_process(db.dsn, *args, env={**no_spark, DRIVER_BATCH_ENV: "0"})
    assert failed.exit_code != 0


def test_the_driver_batch_threshold_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DRIVER_BATCH_ENV, raising=False)
    assert driver_batch_wal() == DRIVER_BATCH_WAL
    assert driver_batch_wal(local_master=True) == EVERY_BATCH  # local Spark: every batch in the driver
    monkeypatch.setenv(DRIVER_BATCH_ENV, "0")
    assert driver_batch_wal() == 0 and driver_batch_wal(local_master=True) == 0
    for bad in ("-1", "16MB"):
        monkeypatch.setenv(DRIVER_BATCH_ENV, bad)
        with pytest.raises(ConfigError, match=DRIVER_BATCH_ENV):
            driver_batch_wal()


def test_a_batch_in_the_driver_stops_at_a_stop_request(db: Any) -> None:
    """SIGINT/SIGTERM during a batch in the driver: the task ends at its next fetch, unfinished, with nothing written."""
    from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
    from pgpoll.source.slots import peek_options

    db.require_plugin("test_decoding")
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    db.execute("INSERT INTO items SELECT generate_series(1, 20000)")
    spec = BatchSpec(dsn=db.dsn, slot=slot, plugin="test_decoding", options=tuple(peek_options("test_decoding")),
                     upto_nchanges=None, high_water_mark=None, fetch="psycopg2")
    asked: list[int] = []

    def stopped() -> bool:
        asked.append(1)
        return len(asked) > 1  # the signal arrives while the first fetch is decoded

    outcome = BatchOutcome()
    rows = sum(batch.num_rows for batch in iter_batch(spec, outcome, stopped=stopped))
    assert rows == 0 and outcome.error is not None and "interrupted" in str(outcome.error)
    assert 0 < outcome.peeked_rows < 20002 and outcome.advance_to is None
    full = BatchOutcome()
    assert sum(batch.num_rows for batch in iter_batch(spec, full)) == 20000 and full.error is None
