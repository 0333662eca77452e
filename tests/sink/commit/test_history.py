"""The records after a state's position are found with reads that depend on how far behind it is, not on
the length of the history (no JVM: outputs built with the real commit-log classes, as in
``test_startup_many_batches``)."""

from __future__ import annotations

from pathlib import Path

from pgpoll.lsn import Lsn
from pgpoll.sink.commit.history import History
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.local import LocalOutputFs
from tests.sink.commit.test_startup_many_batches import STEP, RecordingFs, build


def _end(seq: int) -> Lsn:
    return Lsn(seq * STEP + 0x10)


def _reads(fs: RecordingFs) -> list[str]:
    return [path for op, path in fs.calls if op in ("read_text", "read_tagged")]


def test_a_state_k_records_behind_reads_the_same_records_at_a_hundred_and_at_a_thousand(tmp_path: Path) -> None:
    reads: dict[int, int] = {}
    for batches in (107, 1007):
        root = tmp_path / str(batches)
        build(root, batches)
        fs = RecordingFs(LocalOutputFs(str(root)))
        history = History(CommitLog(fs))
        assert history.high_water_mark == _end(batches) and history.table_dirs() == {"public.t"}
        before = len(_reads(fs))
        assert history.after(_end(batches), "public.t") == []  # up to date: not one read more
        assert len(_reads(fs)) == before
        found = history.after(_end(batches - 20), "public.t")  # 20 records behind
        assert [r.seq for r in found] == list(range(batches - 19, batches + 1))
        reads[batches] = len(_reads(fs))
        assert history.after(Lsn(int(_end(batches - 20)) + 1), "public.t") == found  # a position between records
        assert history.after(_end(batches - 20), "public.other") == []
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
