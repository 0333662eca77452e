"""The commit log without a JVM: the atomic create-if-absent, version 1 read and extended, checkpoints."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit import batches, recovery
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.log import CommitLog, CommitRecord, record_name, summarize
from pgpoll.sink.stores.filesystem import create_exclusive_local, open_output
from pgpoll.sink.stores.local import LocalOutputFs
from tests.sink.conftest import publish_next, stage, write_v1


def test_create_exclusive_lets_exactly_one_of_many_threads_win(tmp_path: Path) -> None:
    target = str(tmp_path / "d" / "record.json")
    barrier = threading.Barrier(16)
    results: list[bool] = []

    def race(i: int) -> None:
        barrier.wait()
        results.append(create_exclusive_local(target, json.dumps({"winner": i})))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 15 + [True]
    assert "winner" in json.loads(Path(target).read_text())  # whole, never partly written
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["record.json"]  # no temp file left


def _create_in_process(target: str, i: int, start: Any, out: Any) -> None:
    start.wait()
    out.put(create_exclusive_local(target, json.dumps({"winner": i})))


def test_create_exclusive_lets_exactly_one_of_many_processes_win(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # no fork: the test process may hold a JVM
    target = str(tmp_path / "record.json")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_create_in_process, args=(target, i, start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert sorted(out.get(timeout=10) for _ in procs) == [False, False, False, True]
    assert "winner" in json.loads(Path(target).read_text())


def test_open_output_maps_local_paths_and_file_uris_to_the_fenced_local_fs(tmp_path: Path) -> None:
    for root in (str(tmp_path), f"file://{tmp_path}", f"file:{tmp_path}"):
        fs = open_output(root)
        assert isinstance(fs, LocalOutputFs) and fs.fenced and fs.root == str(tmp_path.resolve())


def test_a_version_1_output_is_read_and_extended_with_version_2_records(tmp_path: Path) -> None:
    write_v1(tmp_path, 0x100, 0x200, rows=2)
    write_v1(tmp_path, 0x201, 0x300, rows=5)
    sink = BatchSink(None, str(tmp_path))
    assert sink.recover().head == 2 and sink.last_recovery is not None
    plan = sink.plan()
    assert plan.planned_on == 2 and plan.prev == layout.commit_record_name(0x300)
    assert plan.high_water_mark == Lsn(0x300)
    stage(plan)
    record = publish_next(sink, plan)
    assert (record.seq, record.version, record.prev) == (3, 2, layout.commit_record_name(0x300))
    assert (tmp_path / layout.COMMITS / record_name(3)).is_file()

    records = CommitLog(sink.fs).records()
    assert [(r.seq, r.version) for r in records] == [(1, 1), (2, 1), (3, 2)]
    assert CommitLog(sink.fs).high_water_mark() == record.end_lsn
    # the next record names its version-2 predecessor by number
    plan = sink.plan()
    stage(plan)
    assert publish_next(sink, plan).prev == 3
    # names sort in record order: version-1 names (hex) before version-2 names
    names = sorted(p.name for p in (tmp_path / layout.COMMITS).glob("*.json"))
    assert [json.loads((tmp_path / layout.COMMITS / n).read_text())["end"] for n in names] == [
        r.end for r in CommitLog(sink.fs).records()
    ]
    summary = summarize(str(tmp_path))
    assert (summary.records, summary.rows, summary.head) == (4, 13, 4) and summary.slots == ("s",)


def test_a_version_2_record_carries_every_designed_field(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path), run="run-1")
    plan = sink.plan()
    typed = stage(plan, files=2, tables={"public.t": 1})
    record = publish_next(
        sink, plan, tables=typed, first_commit_ts="2024-01-01T00:00:00+00:00", last_commit_ts="2024-01-01T00:00:05+00:00",
        xid_min=2**32 + 5, xid_max=2**63 + 7, table_stats={"public.t": {"rows": 3}}, publications=["p2", "p1"],
    )
    data = json.loads((tmp_path / layout.COMMITS / record_name(1)).read_text())
    assert {
        "version", "seq", "prev", "kind", "start", "end", "rows", "files", "file_sizes", "bytes", "partition", "tables",
        "table_files", "slot", "plugin", "run", "staging", "committed_at", "first_commit_ts", "last_commit_ts",
        "xid_min", "xid_max", "table_stats", "publications",
    } <= set(data)
    assert data["version"] == 2 and data["seq"] == 1 and data["prev"] is None and data["kind"] == "batch"
    assert data["xid_max"] == 2**63 + 7 and data["publications"] == ["p1", "p2"] and data["run"] == "run-1"
    assert data["bytes"] == sum(data["file_sizes"].values()) and sorted(data["file_sizes"]) == data["files"]
    assert data["tables"] == ["public.t"] and data["table_files"] == {"public.t": dict(typed["public.t"])}
    assert "adopted" not in data and CommitRecord.from_json(json.dumps(data)) == record


def test_a_record_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    commits = tmp_path / layout.COMMITS
    commits.mkdir(parents=True)
    (commits / record_name(1)).write_text(json.dumps({"version": 4, "seq": 1}))  # 3: gap records (pgpoll resync)
    with pytest.raises(SinkError, match="newer than this pgpoll"):
        CommitLog(LocalOutputFs(str(tmp_path))).state()


def test_a_record_of_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    commits = tmp_path / layout.COMMITS
    commits.mkdir(parents=True)
    body = {"version": 3, "seq": 1, "kind": "rewind", "start": "0/1", "end": "0/1", "rows": 0, "files": [],
            "partition": None, "slot": "s", "plugin": "pgoutput"}
    (commits / record_name(1)).write_text(json.dumps(body))
    with pytest.raises(SinkError, match="of kind 'rewind', which this pgpoll does not know"):
        CommitLog(LocalOutputFs(str(tmp_path))).state()


def test_the_head_is_found_from_names_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = BatchSink(None, str(tmp_path))
    for _ in range(3):
        plan = sink.plan()
        stage(plan, files=1)
        publish_next(sink, plan)
    fresh = CommitLog(LocalOutputFs(str(tmp_path)))
    monkeypatch.setattr(fresh.fs, "read_text", lambda path: pytest.fail(f"read {path}"))
    assert fresh.head() == 3


def _publish_many(sink: BatchSink, count: int) -> None:
    for _ in range(count):
        plan = sink.plan()
        stage(plan, files=1)
        publish_next(sink, plan, rows=2)


def test_a_checkpoint_folds_records_and_start_up_reads_only_what_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 4)
    write_v1(tmp_path, 0x1, 0x2, rows=7)  # the fold covers version-1 records too
    sink = BatchSink(None, str(tmp_path))
    _publish_many(sink, 5)  # records 2..6: the checkpoint comes with record 4 (4 records since none)
    assert sorted(p.name for p in (tmp_path / layout.CHECKPOINTS).iterdir()) == [record_name(4)]
    checkpoint = json.loads((tmp_path / layout.CHECKPOINTS / record_name(4)).read_text())
    assert checkpoint["kind"] == "checkpoint" and checkpoint["records"] == 4 and checkpoint["rows"] == 7 + 3 * 2
    assert "partitions" not in checkpoint  # 0.3: a checkpoint's size does not grow with the history
    assert checkpoint["tables"] == {}  # no typed tables were written

    fs = LocalOutputFs(str(tmp_path))
    reads: list[str] = []
    real_read = fs.read_text
    monkeypatch.setattr(fs, "read_text", lambda path: reads.append(path.rsplit("/", 1)[1]) or real_read(path))
    state = CommitLog(fs).state()
    assert reads == [record_name(4), record_name(5), record_name(6)]  # the checkpoint, then records 5 and 6
    assert state.head == 6 and [r.seq for r in state.tail] == [5, 6]
    full = CommitLog(LocalOutputFs(str(tmp_path))).records()
    assert state.high_water_mark == max(r.end_lsn for r in full)
    assert [p for p, _t in CommitLog(fs).partitions(state)] == [r.partition for r in full]
    summary = summarize(str(tmp_path))
    assert (summary.records, summary.rows) == (len(full), sum(r.rows for r in full))


def test_recovery_writes_a_checkpoint_once_enough_records_follow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 1000)
    _publish_many(BatchSink(None, str(tmp_path)), 3)
    assert not (tmp_path / layout.CHECKPOINTS).exists()
    monkeypatch.setattr(recovery, "CHECKPOINT_EVERY", 3)
    BatchSink(None, str(tmp_path)).recover()
    assert [p.name for p in (tmp_path / layout.CHECKPOINTS).iterdir()] == [record_name(3)]


def test_an_unreadable_checkpoint_falls_back_to_an_older_one_or_to_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 2)
    _publish_many(BatchSink(None, str(tmp_path)), 5)
    assert sorted(p.name for p in (tmp_path / layout.CHECKPOINTS).iterdir()) == [record_name(2), record_name(4)]
    (tmp_path / layout.CHECKPOINTS / record_name(4)).write_text("{not json")
    state = CommitLog(LocalOutputFs(str(tmp_path))).state()
    assert state.checkpoint is not None and state.checkpoint.seq == 2 and [r.seq for r in state.tail] == [3, 4, 5]
    assert summarize(str(tmp_path)).records == 5


def test_summarize_a_new_or_absent_output(tmp_path: Path) -> None:
    summary = summarize(str(tmp_path / "nothing-here"))
    assert (summary.records, summary.rows, summary.high_water_mark, summary.head) == (0, 0, None, 0)
    assert summary.fenced


def _gap(reason: str | None, server: dict[str, Any] | None) -> CommitRecord:
    return CommitRecord(start="0/3000000", end="0/5000000", rows=0, files=[], partition=None, slot="s", plugin="p",
                        version=3, seq=2, kind="gap", resume="0/5000000", server=server, reason=reason)


def test_a_gap_of_a_new_history_is_covered_only_by_a_snapshot_of_that_server_planned_after_it() -> None:
    new = _gap("timeline_diverged", {"system_identifier": "7", "timeline": 2})
    after = int(Lsn.parse("0/5000001"))
    assert new.new_history and new.covered_by(after, {"system_identifier": "7", "timeline": 2})
    assert new.covered_by(after, {"system_identifier": "7", "timeline": 3})  # a later failover of that server
    assert not new.covered_by(after, {"system_identifier": "7", "timeline": 1})  # the old timeline, positions reused
    assert not new.covered_by(after, {"system_identifier": "8", "timeline": 2})
    assert not new.covered_by(after, None)  # a plan naming no server predates every such gap
    assert not new.covered_by(int(Lsn.parse("0/4FFFFFF")), {"system_identifier": "7", "timeline": 2})
    old = _gap(None, None)  # a slot moved past the output, marked by an older pgpoll: by position alone
    assert not old.new_history and old.covered_by(after, None) and old.covered_by(after, {"timeline": 1})
