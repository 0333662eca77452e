"""Retention's rules on outputs built with the real commit-log classes (no server, no JVM): a killed run is
finished by the next, start-up stays a bounded read, a stale pointer lists, a building or lagging destination
holds the floor, and a snapshot's needs follow materialize's own rule (a commit waiting on a synchronous
standby included)."""

from __future__ import annotations

import json
import runpy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgpoll.errors import ConfigError, SinkError
from pgpoll.housekeeping.retention import run_retain
from pgpoll.housekeeping.retention_plan import SnapshotNeed, plan_retention
from pgpoll.lsn import Lsn
from pgpoll.sink import destinations, layout
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.floor import FLOOR_FILE, read_floor
from pgpoll.sink.commit.history import History
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.stores.local import LocalOutputFs
from tests.sink.commit.test_startup_many_batches import STEP, RecordingFs, build


def _now() -> datetime:
    """Later than every record the test wrote."""
    return datetime.now(UTC) + timedelta(seconds=1)

EVERYTHING = timedelta(0)


class FailingFs(RecordingFs):
    """Deletes fail after ``left`` of them: a run killed midway."""

    def __init__(self, inner: Any, left: int) -> None:
        super().__init__(inner)
        self.left = left

    def delete(self, path: str) -> None:
        if self.left == 0:
            raise SinkError("killed", "rerun")
        self.left -= 1
        self.inner.delete(path)


def _commits(root: Path) -> list[int]:
    return sorted(int(p.name[4:20]) for p in (root / layout.COMMITS).glob("seq-*.json"))


def test_a_killed_run_is_finished_by_the_next_and_start_up_stays_bounded(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    build(tmp_path, 120)
    monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")  # a killed run's lease would be taken over: leave it out
    with pytest.raises(SinkError):
        run_retain(str(tmp_path), EVERYTHING, now=_now(), fs=FailingFs(LocalOutputFs(str(tmp_path)), 40))
    monkeypatch.delenv("PGPOLL_TEST_NO_LOCK")
    floor = read_floor(LocalOutputFs(str(tmp_path)))
    assert floor is not None and floor.seq == 119 and not floor.done  # written before anything was deleted
    assert _commits(tmp_path)[0] == 1  # the records go last: none yet
    last = layout.partition_name(119 * STEP, 119 * STEP + 0x10)
    (tmp_path / layout.COMMITS / "seq-0000000000000119.json").unlink()  # as if a second run raced the first
    (tmp_path / layout.META / "newest-checkpoint.json").unlink()  # recovery's full pass runs at the next start
    BatchSink(None, str(tmp_path)).recover(full=True)
    assert not (tmp_path / layout.CHANGES / last).exists() and not (tmp_path / layout.UNRECORDED).exists()  # below
    # the floor, a partition without its record is retention's: deleted, not set aside as unrecorded

    out = run_retain(str(tmp_path), EVERYTHING, now=_now())

    assert out["finished"] == 118 and out["batches"] == 0
    floor = read_floor(LocalOutputFs(str(tmp_path)))
    assert floor is not None and floor.done and floor.tables["public.t"][:2] == [119, str(Lsn(119 * STEP + 0x10))]
    assert _commits(tmp_path) == [120]
    assert sorted(p.name for p in (tmp_path / layout.CHANGES).iterdir() if p.name.startswith("lsn_range")) == [
        layout.partition_name(120 * STEP, 120 * STEP + 0x10)]
    fs = RecordingFs(LocalOutputFs(str(tmp_path)))
    state = CommitLog(fs).state()
    assert state.head == 120 and not state.listed and state.checkpoint is not None and state.checkpoint.seq == 120
    assert [r.seq for r in CommitLog(fs).records_after(0)] == [120]  # pgpoll batches' read: from the floor up
    assert not [p for op, p in fs.calls if op == "list"]
    history = History(CommitLog(LocalOutputFs(str(tmp_path))))
    with pytest.raises(ConfigError, match="pgpoll retain removed batches"):
        history.after(None, "public.t")  # a rebuild from the start would miss them: never silently
    assert [r.seq for r in history.after(Lsn(119 * STEP + 0x10), "public.t")] == [120]


def test_a_pointer_left_at_a_checkpoint_whose_record_is_gone_lists_and_finds_the_head(tmp_path: Path) -> None:
    build(tmp_path, 120)
    run_retain(str(tmp_path), EVERYTHING, now=_now())
    (tmp_path / layout.META / "newest-checkpoint.json").write_text(json.dumps({"seq": 100, "clean": True}))
    state = CommitLog(LocalOutputFs(str(tmp_path))).state()
    assert state.listed and state.head == 120 and state.checkpoint is not None and state.checkpoint.seq == 120


def test_a_building_or_lagging_destination_holds_the_floor_until_it_is_unregistered(tmp_path: Path) -> None:
    build(tmp_path, 30)
    fs = LocalOutputFs(str(tmp_path))
    started = destinations.start_run(fs, "s3://lake/a", "delta", None, 0, "r1")  # a run that died while building
    plan = plan_retention(fs, EVERYTHING, _now())
    assert plan.floor == 0 and "s3://lake/a (delta) has a materialize run" in plan.warnings[-1]
    destinations.end_run(fs, started, {"public.t": str(Lsn(10 * STEP + 0x10))})
    destinations.start_run(fs, "s3://lake/b", "parquet", None, 0, "r2")
    destinations.end_run(fs, destinations.find(fs, destinations.destination_key("s3://lake/b", "parquet")) or started,
                         {"public.t": str(Lsn(25 * STEP + 0x10))})
    plan = plan_retention(fs, EVERYTHING, _now())
    assert plan.floor == 10 and "s3://lake/a (delta) has applied the batches only up to" in plan.warnings[-1]
    assert "pgpoll retain --unregister s3://lake/a" in plan.warnings[-1]
    assert [d.dest for d in destinations.unregister(fs, "s3://lake/a")] == ["s3://lake/a"]
    assert plan_retention(fs, EVERYTHING, _now()).floor == 25  # now the position of lake/b
    assert plan_retention(fs, timedelta(days=1), _now()).floor == 0  # nothing is a day old


def _record(end: int, xid_min: int | None, xid_max: int | None) -> CommitRecord:
    return CommitRecord(start=str(Lsn(end)), end=str(Lsn(end)), rows=1, files=[], partition=None, slot="s",
                        plugin="pgoutput", xid_min=xid_min, xid_max=xid_max, tables=["public.t"])


def test_a_snapshot_needs_what_materialize_would_read_on_it() -> None:
    need = SnapshotNeed("20260101T000000Z-abcd", "public.t", plan_lsn=1000, min_xmin=500)
    assert not need.needs(_record(900, 400, 499))  # every transaction visible to every chunk
    assert need.needs(_record(900, 400, 500))  # before the plan by LSN, but in progress for a chunk (a commit waiting
    # on a synchronous standby): the rebuild reads it, so retention keeps it
    assert need.needs(_record(1100, 600, 700))
    assert not need.needs(_record(1000, None, None))  # no transaction ids (older ingest): by LSN, as materialize
    assert need.needs(_record(1001, None, None))


def test_the_housekeeping_job_runs_retain_with_the_retention_it_is_given(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    job = runpy.run_path(str(Path(__file__).resolve().parents[2] / "jobs" / "housekeeping.py"))
    build(tmp_path, 30)
    job["run"](["--output", str(tmp_path)])  # no --retention, no PGPOLL_RETENTION: off, nothing removed
    assert _commits(tmp_path) == list(range(1, 31))
    job["run"](["--output", str(tmp_path), "--retention", "0h"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert lines[-1]["job"] == "housekeeping" and lines[-1]["steps"]["retain"] == 0  # the summary the operator reads
    assert lines[-2]["batches"] == 29 and _commits(tmp_path) == [30]  # retain's own line, then the job's


class RegisteringFs(RecordingFs):
    """A materialize run registers DEST on the floor it read (0) just as retention writes a higher floor: the
    race between retention's read of the registry and its removal."""

    def __init__(self, inner: Any, dest: str) -> None:
        super().__init__(inner)
        self.dest = dest
        self.started: destinations.Destination | None = None

    def write_text(self, path: str, text: str) -> None:
        if path.endswith(FLOOR_FILE) and self.started is None:
            self.started = destinations.start_run(self.inner, self.dest, "parquet", None, floor=0, run="late")
        self.inner.write_text(path, text)


def test_a_materialize_that_started_before_the_floor_rose_defers_the_removal(tmp_path: Path) -> None:
    build(tmp_path, 30)
    fs = RegisteringFs(LocalOutputFs(str(tmp_path)), str(tmp_path / "state"))

    out = run_retain(str(tmp_path), EVERYTHING, now=_now(), fs=fs)

    assert fs.started is not None and out["deferred"] == [fs.started.name]
    floor = read_floor(LocalOutputFs(str(tmp_path)))
    assert floor is not None and floor.seq == 29 and not floor.done  # raised, nothing removed under it yet
    assert _commits(tmp_path) == list(range(1, 31))
    assert len([p for p in (tmp_path / layout.CHANGES).iterdir() if p.name.startswith("lsn_range")]) == 30
    again = run_retain(str(tmp_path), EVERYTHING, now=_now())  # the run has not ended: still deferred
    assert again["deferred"] == [fs.started.name] and _commits(tmp_path)[0] == 1

    destinations.end_run(LocalOutputFs(str(tmp_path)), fs.started, {"public.t": str(Lsn(30 * STEP + 0x10))})
    done = run_retain(str(tmp_path), EVERYTHING, now=_now())

    assert done["deferred"] == [] and done["finished"] == 29
    assert _commits(tmp_path) == [30]
    floor = read_floor(LocalOutputFs(str(tmp_path)))
    assert floor is not None and floor.done


def test_records_published_after_the_runs_checkpoint_are_kept(tmp_path: Path) -> None:
    build(tmp_path, 30)
    fs = LocalOutputFs(str(tmp_path))

    plan = plan_retention(fs, EVERYTHING, _now(), folded=20)  # the head is 30; the run's checkpoint folded 20

    assert plan.floor == 20
    assert max(r.seq for r in plan.records) == 20
