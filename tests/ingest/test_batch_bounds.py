"""Batches bounded by WAL bytes: where a peek stops, and that every change still lands once."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from pgpoll.ingest.batch_bounds import Bounds, batch_bounds
from pgpoll.lsn import Lsn
from pgpoll.source.slots import SlotInfo
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, read_output


def _slot(confirmed: int, lag: int | None) -> SlotInfo:
    return SlotInfo("s", "pgoutput", "logical", "postgres", False, None, Lsn(confirmed), Lsn(confirmed), "reserved",
                    None, lag)


def test_a_budget_that_reaches_the_end_of_wal_leaves_the_peek_unbounded() -> None:
    bounds = batch_bounds(_slot(1000, 500), None, batch_wal=500)
    assert bounds == Bounds(None, None) and bounds.to_end and bounds.caught_up(10**9)


def test_a_budget_short_of_the_end_bounds_the_peek_from_its_start() -> None:
    bounds = batch_bounds(_slot(1000, 501), None, batch_wal=500)
    assert bounds == Bounds(1500, None) and not bounds.to_end and not bounds.caught_up(0)


def test_the_peek_starts_at_the_high_water_mark_when_the_slot_is_behind_it() -> None:
    # after a server crash the slot can be back before what the output holds: the batch re-advances it first
    assert batch_bounds(_slot(1000, 900), Lsn(1200), batch_wal=500) == Bounds(1700, None)
    assert batch_bounds(_slot(1000, 600), Lsn(1200), batch_wal=500).to_end


def test_growth_multiplies_the_budget_and_zero_means_none() -> None:
    assert batch_bounds(_slot(0, 2000), None, batch_wal=500, growth=4) == Bounds(None, None)
    assert batch_bounds(_slot(0, 2001), None, batch_wal=500, growth=4) == Bounds(2000, None)
    assert batch_bounds(_slot(0, 10**12), None, batch_wal=0) == Bounds(None, None)


def test_a_row_limit_keeps_the_run_from_reading_to_the_end() -> None:
    bounds = batch_bounds(_slot(0, 10), None, batch_wal=500, changes=100)
    assert bounds == Bounds(None, 100) and not bounds.to_end
    assert bounds.caught_up(99) and not bounds.caught_up(100)


def _records(output: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((Path(output) / "_pgpoll" / "commits").glob("seq-*.json"))]


def _ids(spark: Any, capture: Capture) -> list[int]:
    return sorted(int(r["after"]["id"]) for r in read_output(spark, capture.output) if r["op"] == "I")


def test_a_backlog_under_the_default_budget_is_one_batch_that_takes_the_heartbeat_in(capture: Capture, spark: Any) -> None:
    db = capture.db
    for i in range(5):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 100 + 1, i * 100 + 100))

    result = ingest(db.dsn, *capture.args())

    assert result.exit_code == 0, result.stderr
    assert result.summary and result.summary["batches"] == 1 and result.summary["changes"] == 500
    (record,) = _records(capture.output)
    assert record["rows"] == 500 and record["table_stats"] is not None  # counters read before the heartbeat
    # the heartbeat is in the batch: the slot ends past it, at the batch's end
    assert record["end"] == confirmed_lsn(db, capture.slot) == result.summary["last_lsn"]
    assert result.summary["lag_bytes"] < 1024
    assert _ids(spark, capture) == list(range(1, 501))


def test_a_small_budget_makes_many_batches_each_change_once_in_order(capture: Capture, spark: Any) -> None:
    db = capture.db
    for i in range(12):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 50 + 1, i * 50 + 50))

    result = ingest(db.dsn, *capture.args("--batch-wal", "8kB"))

    assert result.exit_code == 0, result.stderr
    assert result.summary and result.summary["batches"] >= 4 and result.summary["changes"] == 600
    records = _records(capture.output)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    ends = [Lsn.parse(r["end"]) for r in records]
    assert all(a < b for a, b in itertools.pairwise(ends))
    assert records[-1]["table_stats"] is not None and records[-1]["end"] == confirmed_lsn(db, capture.slot)
    assert _ids(spark, capture) == list(range(1, 601))


def test_a_transaction_larger_than_the_budget_is_one_batch(capture: Capture, spark: Any) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 3000) g")  # about 200 kB of WAL
    db.execute("INSERT INTO items SELECT g, 'y' FROM generate_series(3001, 3010) g")

    result = ingest(db.dsn, *capture.args("--batch-wal", "4kB"))

    assert result.exit_code == 0, result.stderr
    assert result.summary and result.summary["changes"] == 3010
    big = [r for r in _records(capture.output) if r["rows"] >= 3000]
    assert len(big) == 1  # bounded peeks found nothing, and a doubled budget took it whole
    assert _ids(spark, capture) == list(range(1, 3011))


@pytest.mark.parametrize("args", [("--batch-changes", "120"), ("--max-changes", "130")])
def test_row_limits_still_apply_under_the_wal_budget(capture: Capture, spark: Any, args: tuple[str, str]) -> None:
    db = capture.db
    for i in range(5):
        db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(%s, %s) g", (i * 100 + 1, i * 100 + 100))

    first = ingest(db.dsn, *capture.args(*args))

    assert first.exit_code == 0, first.stderr
    assert first.summary is not None
    if args[0] == "--batch-changes":
        assert first.summary["batches"] >= 3 and first.summary["changes"] == 500
    else:
        assert first.summary["changes"] < 500
        assert ingest(db.dsn, *capture.args()).exit_code == 0
    assert _ids(spark, capture) == list(range(1, 501))
