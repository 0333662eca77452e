"""The records after a state's position are found with reads that depend on how far behind it is, not on
the length of the history (no JVM: outputs built with the real commit-log classes, as in
``test_startup_many_batches``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit import batches
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.history import History
from pgpoll.sink.commit.log import CommitLog, record_name
from pgpoll.sink.stores.local import LocalOutputFs
from tests.sink.commit.test_startup_many_batches import STEP, RecordingFs, build
from tests.sink.conftest import publish_next, stage


def _end(seq: int) -> Lsn:
    return Lsn(seq * STEP + 0x10)


def _reads(fs: RecordingFs) -> list[str]:
    return [path for op, path in fs.calls if op in ("read_text", "read_tagged")]


def test_a_state_k_records_behind_reads_the_same_records_at_a_hundred_and_at_a_thousand(tmp_path: Path) -> None:
    reads: dict[int, int] = {}
    for count in (107, 1007):
        root = tmp_path / str(count)
        build(root, count)
        fs = RecordingFs(LocalOutputFs(str(root)))
        history = History(CommitLog(fs))
        assert history.high_water_mark == _end(count) and history.table_dirs() == {"public.t"}
        before = len(_reads(fs))
        assert history.after(_end(count), "public.t") == []  # up to date: not one read more
        assert len(_reads(fs)) == before
        found = history.after(_end(count - 20), "public.t")  # 20 records behind
        assert [r.seq for r in found] == list(range(count - 19, count + 1))
        reads[count] = len(_reads(fs))
        assert history.after(Lsn(int(_end(count - 20)) + 1), "public.t") == found  # a position between records
        assert history.after(_end(count - 20), "public.other") == []
    assert reads[107] == reads[1007] < 2 + 7 + 20 + 12, reads  # pointer, checkpoint, tail; then the search's steps


def test_a_rebuild_reads_every_record_of_the_table_and_a_table_idle_since_long_ago_is_found(tmp_path: Path) -> None:
    build(tmp_path, 120, table="public.a")
    build(tmp_path, 260, first=121, table="public.b")  # public.a is named by no record after 120
    fs = RecordingFs(LocalOutputFs(str(tmp_path)))
    history = History(CommitLog(fs))
    assert history.table_dirs() == {"public.a", "public.b"}
    assert [r.seq for r in history.after(None, "public.a")] == list(range(1, 121))
    assert history.after(_end(120), "public.a") == []  # known from the checkpoint's table index alone
    assert [r.seq for r in history.after(_end(100), "public.a")] == list(range(101, 121))
    assert [r.seq for r in history.after(_end(1), "public.b")] == list(range(121, 261))
    assert History(None).after(None, "public.a") == [] and History(None).high_water_mark is None


def test_the_publisher_chains_each_table_and_the_rows_so_that_heartbeats_and_other_tables_are_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 10)  # start-up then reads the checkpoint, not the records
    sink = BatchSink(None, str(tmp_path))
    kinds = ["a", "heartbeat", "b", "heartbeat", "heartbeat", "a", "b", "heartbeat", "a", "heartbeat"]
    for kind in kinds:
        plan = sink.plan()
        tables = stage(plan, files=1, tables={f"public.{kind}": 1}) if kind != "heartbeat" else {}
        publish_next(sink, plan, rows=0 if kind == "heartbeat" else 2, tables=tables)
    records = CommitLog(LocalOutputFs(str(tmp_path))).records()
    assert [(r.prev_rows, r.prev_tables) for r in records[:4]] == [(0, {"public.a": 0}), (1, {}), (1, {"public.b": 0}),
                                                                   (3, {})]
    assert (records[8].prev_rows, records[8].prev_tables) == (7, {"public.a": 6})
    fs = RecordingFs(LocalOutputFs(str(tmp_path)))
    history = History(CommitLog(fs))
    state_reads = len(_reads(fs))
    assert history.state.tail == () and state_reads == 3  # the pointer, checkpoint 10 and the retention floor (none)
    assert [r.seq for r in history.after(records[0].end_lsn, "public.a")] == [6, 9]
    assert [r.seq for r in history.after(None, "public.b")] == [3, 7]
    # the records read: 9 and 6 and 1 (where the walk stops) for public.a; 7, 3 for public.b: no heartbeat
    assert sorted(set(_reads(fs)[state_reads:])) == [f"{layout.COMMITS}/{record_name(s)}" for s in (1, 3, 6, 7, 9)]
