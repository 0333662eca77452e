"""The run history: records written one file per run, folded by compare-and-swap, bounded, never lost to a race."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgpoll.observe import run_history
from pgpoll.observe.run_history import FOLD_AT, History, RunRecord, fold, load_history, record_run
from pgpoll.sink import layout
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rec(n: int, job: str = "ingest", exit_code: int = 0, status: str = "ok", changes: int = 1) -> RunRecord:
    ended = T0 + timedelta(seconds=n)
    return RunRecord(run_id=f"r{n:05d}", job=job, started_at=(ended - timedelta(seconds=1)).isoformat(),
                     ended_at=ended.isoformat(), seconds=1.0, status=status, exit_code=exit_code, slot="s",
                     batches=1, changes=changes, bytes=10)


def test_fold_keeps_the_newest_counts_everything_and_ignores_a_record_it_holds() -> None:
    history = fold(History(), [rec(3), rec(1), rec(2, exit_code=5, status="error")], keep=2)
    assert [r.run_id for r in history.records] == ["r00002", "r00003"]
    assert history.dropped == 1
    totals = history.totals["ingest"]
    assert (totals.runs, totals.failures, totals.changes, totals.bytes) == (3, 1, 3, 30)
    again = fold(history, [rec(3), rec(4, job="materialize")], keep=2)  # r00003 is held: not counted twice
    assert again.totals["ingest"].runs == 3 and again.totals["materialize"].runs == 1
    assert History.parse(again.to_json()) == again


def test_last_success_and_failure_by_job() -> None:
    history = fold(History(), [rec(1), rec(2, exit_code=4, status="error"), rec(3, job="materialize")])
    assert history.last("ingest", succeeded=True) == rec(1)
    failed = history.last("ingest", succeeded=False)
    assert failed is not None and failed.exit_code == 4
    assert history.last("snapshot") is None


def test_each_run_is_a_file_until_enough_gather_then_one_fold(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    for n in range(FOLD_AT - 1):
        record_run(fs, rec(n))
    assert not (tmp_path / layout.RUNS_FOLDED).exists()
    assert len(list((tmp_path / layout.RUNS).iterdir())) == FOLD_AT - 1
    history = record_run(fs, rec(FOLD_AT - 1))
    assert (tmp_path / layout.RUNS_FOLDED).exists() and list((tmp_path / layout.RUNS).iterdir()) == []
    assert len(history.records) == FOLD_AT and history.totals["ingest"].runs == FOLD_AT
    assert load_history(fs) == history
    record_run(fs, rec(FOLD_AT, exit_code=3, status="busy"))
    loaded = load_history(fs)
    assert loaded.totals["ingest"].runs == FOLD_AT + 1 and loaded.totals["ingest"].failures == 1


def test_the_history_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_history, "KEEP", 12)
    monkeypatch.setattr(run_history, "FOLD_AT", 5)
    fs = open_output(str(tmp_path))
    for n in range(30):
        record_run(fs, rec(n))
    folded = History.parse((tmp_path / layout.RUNS_FOLDED).read_text())
    assert [r.run_id for r in folded.records] == [f"r{n:05d}" for n in range(30 - 12, 30)]
    assert folded.totals["ingest"].runs == 30  # dropped records still count
    assert folded.dropped == 30 - 12
    assert list((tmp_path / layout.RUNS).iterdir()) == []


def test_racing_runs_lose_no_record(tmp_path: Path) -> None:
    """Eight threads record 3 * FOLD_AT runs at once: folds race (one swap wins), yet every run is counted once."""
    fs = open_output(str(tmp_path))
    count = 3 * FOLD_AT
    numbers = iter(range(count))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            try:
                record_run(open_output(str(tmp_path)), rec(n))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], [repr(e) for e in errors]
    history = load_history(fs)
    assert history.totals["ingest"].runs == count
    assert sorted(r.run_id for r in history.records) == [f"r{n:05d}" for n in range(count)]


def test_a_file_left_by_a_fold_that_died_is_not_counted_twice(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    folded = fold(History(), [rec(1), rec(2)])
    fs.mkdirs(fs.path(layout.RUNS))
    fs.create_exclusive(fs.path(layout.RUNS_FOLDED), folded.to_json())
    fs.create_exclusive(fs.path(layout.RUNS, rec(2).file_name()), rec(2).to_json())  # the delete never happened
    (tmp_path / layout.RUNS / f"_tmp.1234.{rec(3).file_name()}").write_text(rec(3).to_json())  # a create in progress
    assert load_history(fs).totals["ingest"].runs == 2


def test_a_record_keeps_no_error_text_and_reads_back_with_unknown_keys() -> None:
    record = replace(rec(1, exit_code=5, status="error"), error="SinkError")
    data = json.loads(record.to_json())
    assert RunRecord.from_json({**data, "added_later": 1}) == record
    assert not record.succeeded


def test_the_history_folds_on_an_object_store_with_its_compare_and_swap(store_bucket: StoreBucket,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 (SeaweedFS, moto) and Azure (Azurite): If-None-Match for the first fold, If-Match for the next ones."""
    monkeypatch.setattr(run_history, "FOLD_AT", 3)
    fs = open_output(store_bucket.url)
    for n in range(7):
        record_run(fs, rec(n))
    assert [name for name, _d, _s in fs.list(fs.path(layout.RUNS))] == [rec(6).file_name()]
    history = load_history(fs)
    assert history.totals["ingest"].runs == 7 and len(history.records) == 7
