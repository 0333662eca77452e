"""Start-up stays flat as the output grows: what it reads does not depend on the number of batches (no JVM).

Outputs of thousands of batches are built with the real commit-log classes
(:class:`CommitRecord` serialised to its real file name, checkpoints written by
:meth:`CommitLog.write_checkpoint`, partition directories with a file), then
start-up runs against the real local filesystem behind a thin wrapper that
records every call. Both sides of recovery's full pass are tested: skipped once
the pointer says a pass ran and the log has no version-1 record, run when it
can find something.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.log import (
    CHECKPOINT_EVERY,
    KEEP_CHECKPOINTS,
    POINTER,
    CommitLog,
    CommitRecord,
    LogState,
    record_name,
    summarize,
)
from pgpoll.sink.stores.filesystem import OutputFs
from pgpoll.sink.stores.local import LocalOutputFs
from tests.sink.conftest import write_v1

FILE = "part-00000.parquet"
STEP = 0x100  # record seq covers commit LSNs seq*STEP .. seq*STEP + 0x10


class RecordingFs:
    """The real local OutputFs, recording ``(operation, path relative to the root)`` of every call."""

    def __init__(self, fs: OutputFs) -> None:
        self.inner = fs
        self.root, self.scheme, self.fenced, self.atomic_dir_rename = fs.root, fs.scheme, fs.fenced, fs.atomic_dir_rename
        self.direct_writes = fs.direct_writes
        self.calls: list[tuple[str, str]] = []

    def _note(self, op: str, path: str) -> None:
        self.calls.append((op, path[len(self.root):].lstrip("/")))

    def path(self, *parts: str) -> str:
        return self.inner.path(*parts)

    def exists(self, path: str) -> bool:
        self._note("exists", path)
        return self.inner.exists(path)

    def mkdirs(self, path: str) -> None:
        self._note("mkdirs", path)
        self.inner.mkdirs(path)

    def delete(self, path: str) -> None:
        self._note("delete", path)
        self.inner.delete(path)

    def rename(self, src: str, dst: str) -> None:
        self._note("rename", src)
        self.inner.rename(src, dst)

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        self._note("list", path)
        return self.inner.list(path)

    def read_text(self, path: str) -> str:
        self._note("read_text", path)
        return self.inner.read_text(path)

    def write_text(self, path: str, text: str) -> None:
        self._note("write_text", path)
        self.inner.write_text(path, text)

    def create_exclusive(self, path: str, text: str) -> bool:
        self._note("create_exclusive", path)
        return self.inner.create_exclusive(path, text)

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        self._note("read_tagged", path)
        return self.inner.read_tagged(path)

    def swap(self, path: str, text: str, tag: str) -> bool:
        self._note("swap", path)
        return self.inner.swap(path, text, tag)

    def arrow(self) -> Any:
        return self.inner.arrow()

    def arrow_path(self, path: str) -> str:
        return self.inner.arrow_path(path)

    def put_file(self, local: str, path: str) -> int:
        self._note("put_file", path)
        return self.inner.put_file(local, path)

    def ops(self) -> Counter[str]:
        return Counter(op for op, _path in self.calls)


def _record(seq: int, table: str | None) -> CommitRecord:
    partition = layout.partition_name(seq * STEP, seq * STEP + 0x10)
    tables = {table: {FILE: 4}} if table else {}
    return CommitRecord(
        start=str(Lsn(seq * STEP)), end=str(Lsn(seq * STEP + 0x10)), rows=1, files=[FILE], partition=partition,
        slot="s", plugin="pgoutput", seq=seq, prev=seq - 1 or None, file_sizes={FILE: 4}, bytes=4,
        tables=sorted(tables), table_files=tables, staging=f"staging-{seq}",
    )


def build(root: Path, batches: int, *, first: int = 1, table: str | None = "public.t") -> None:
    """Records ``first``..``batches`` with their partitions, and a checkpoint every CHECKPOINT_EVERY records.

    The files are the real ones (real names, ``CommitRecord.to_json``, checkpoints by the commit log itself);
    only the atomic create is replaced by a plain write, to build thousands quickly.
    """
    log = CommitLog(LocalOutputFs(str(root)))
    commits = root / layout.COMMITS
    commits.mkdir(parents=True, exist_ok=True)
    state = log.state()
    tail = list(state.tail)
    for seq in range(first, batches + 1):
        record = _record(seq, table)
        for directory in [root / layout.CHANGES] + ([root / layout.TABLES / table] if table else []):
            (directory / str(record.partition)).mkdir(parents=True)
            (directory / str(record.partition) / FILE).write_bytes(b"PAR1")
        (commits / record_name(seq)).write_text(record.to_json())
        tail.append(record)
        if len(tail) >= CHECKPOINT_EVERY:
            state = LogState(head=seq, checkpoint=state.checkpoint, tail=tuple(tail), v1_names=state.v1_names)
            log.write_checkpoint(state, seq)
            state = LogState(head=seq, checkpoint=state.fold(seq), tail=(), v1_names=state.v1_names)
            tail = []


def start_up(root: Path) -> tuple[RecordingFs, BatchSink]:
    """What a run does with the output before its first batch, and its empty batch: recover, plan, discard."""
    fs = RecordingFs(LocalOutputFs(str(root)))
    sink = BatchSink(None, str(root), fs=fs)
    sink.check_writable()
    sink.recover()
    plan = sink.plan()
    sink.discard(plan)
    summarize(str(root), fs=fs)
    return fs, sink


def _stray(root: Path, start: int, end: int) -> str:
    name = layout.partition_name(start, end)
    (root / layout.CHANGES / name).mkdir(parents=True)
    (root / layout.CHANGES / name / FILE).write_bytes(b"PAR1")
    return name


def test_start_up_reads_the_same_files_for_a_hundred_batches_and_for_thousands(tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    build(small, 2 * CHECKPOINT_EVERY + 7)
    build(large, 80 * CHECKPOINT_EVERY + 7)  # 4,007 batches, 4,007 partitions in changes/ and in tables/public.t/
    for root in (small, large):
        start_up(root)  # the first start of this version: the full pass runs once, and says so in the pointer
    seen = {root.name: start_up(root)[0] for root in (small, large)}
    for fs in seen.values():
        listed = {path for op, path in fs.calls if op == "list"}
        assert listed == {layout.STAGING}, listed  # neither commits/, checkpoints/, changes/ nor tables/
        reads = [path for op, path in fs.calls if op in ("read_text", "read_tagged")]
        assert reads[0] == f"{layout.META}/{POINTER}" and reads[1].startswith(f"{layout.CHECKPOINTS}/seq-")
        assert len(reads) == 2 * (2 + 7)  # pointer, checkpoint, the 7 records after it; summarize reads them again
    assert seen["small"].ops() == seen["large"].ops()  # the same calls, whatever the number of batches
    state = CommitLog(LocalOutputFs(str(large))).state()
    everything = CommitLog(LocalOutputFs(str(large))).records()
    assert state.head == len(everything) == 4007 and not state.listed and len(state.tail) == 7
    assert state.high_water_mark == max(r.end_lsn for r in everything)
    assert [p for p, _t in CommitLog(LocalOutputFs(str(large))).partitions(state)] == [r.partition for r in everything]
    assert state.table_index() == {"public.t": (4007, everything[-1].end)}
    # the checkpoint folds what start-up needs, not every partition: the same size at 107 and 4,007 batches
    sizes = [len(max((root / layout.CHECKPOINTS).iterdir()).read_bytes()) for root in (small, large)]
    assert max(sizes) < 1000 and max(sizes) - min(sizes) < 16, sizes  # a few more digits in the totals


def test_the_full_pass_is_skipped_once_recorded_and_runs_again_without_the_pointer(tmp_path: Path) -> None:
    build(tmp_path, CHECKPOINT_EVERY + 3)
    pointer = tmp_path / layout.META / POINTER
    assert json.loads(pointer.read_text())["clean"] is False  # a checkpoint, but no full pass yet
    hwm = CommitLog(LocalOutputFs(str(tmp_path))).high_water_mark()
    assert hwm is not None
    above = _stray(tmp_path, int(hwm) + 1, int(hwm) + 0x10)  # a crashed version-1 pgpoll's, say
    first = BatchSink(None, str(tmp_path)).recover()
    assert first.removed_partitions == (above,) and json.loads(pointer.read_text())["clean"] is True

    again = _stray(tmp_path, int(hwm) + 1, int(hwm) + 0x20)  # copied in by hand after the full pass
    fs = RecordingFs(LocalOutputFs(str(tmp_path)))
    skipped = BatchSink(None, str(tmp_path), fs=fs).recover()
    assert skipped.removed_partitions == () and (tmp_path / layout.CHANGES / again).is_dir()
    assert {path for op, path in fs.calls if op == "list"} == {layout.STAGING}

    pointer.unlink()  # the documented way to have the next start look at everything again
    found = BatchSink(None, str(tmp_path)).recover()
    assert found.removed_partitions == (again,) and not (tmp_path / layout.CHANGES / again).exists()
    assert json.loads(pointer.read_text()) | {"written_at": None} == {
        "seq": CHECKPOINT_EVERY, "clean": True, "version": 2, "written_at": None}


def test_outputs_with_version_1_records_get_the_full_pass_at_every_start(tmp_path: Path) -> None:
    write_v1(tmp_path, 0x10, 0x20)  # record 1, as pgpoll 0.x wrote it
    build(tmp_path, CHECKPOINT_EVERY + 3, first=2, table=None)
    assert not (tmp_path / layout.META / POINTER).exists()  # its checkpoint folds a version-1 record
    hwm = CommitLog(LocalOutputFs(str(tmp_path))).high_water_mark()
    assert hwm is not None
    for round_ in range(2):
        below = _stray(tmp_path, 0x21 + round_, 0x22 + round_)  # at or below the high-water mark: set aside
        above = _stray(tmp_path, int(hwm) + 1, int(hwm) + 0x10 + round_)  # above it: removed
        fs = RecordingFs(LocalOutputFs(str(tmp_path)))
        report = BatchSink(None, str(tmp_path), fs=fs).recover()
        assert report.removed_partitions == (above,) and report.unrecorded == (f"{layout.CHANGES}/{below}",)
        assert {layout.COMMITS, layout.CHANGES} <= {path for op, path in fs.calls if op == "list"}


def test_a_pointer_that_does_not_hold_falls_back_to_the_listing(tmp_path: Path) -> None:
    build(tmp_path, 2 * CHECKPOINT_EVERY + 5)
    BatchSink(None, str(tmp_path)).recover()  # the full pass: the pointer is clean
    pointer = tmp_path / layout.META / POINTER
    commits = tmp_path / layout.COMMITS

    # Stale (names an older checkpoint): the same log, read from further back.
    pointer.write_text(json.dumps({"seq": CHECKPOINT_EVERY, "clean": True}))
    stale = CommitLog(LocalOutputFs(str(tmp_path))).state()
    assert (stale.head, stale.checkpoint and stale.checkpoint.seq, len(stale.tail)) == (105, 50, 55) and not stale.listed

    # A hole above the checkpoint (record 103 removed by hand): listed, the head is still the largest seq.
    (commits / record_name(103)).rename(tmp_path / "103.json")
    holed = CommitLog(LocalOutputFs(str(tmp_path))).state()
    assert holed.listed and holed.head == 105 and [r.seq for r in holed.tail] == [101, 102, 104, 105]
    (tmp_path / "103.json").rename(commits / record_name(103))

    # Names a checkpoint whose last record is gone (records 96..105 removed by hand): listed, and the full pass
    # runs after all (listing the partitions before the log is read again); theirs are above the new head's mark.
    pointer.write_text(json.dumps({"seq": 2 * CHECKPOINT_EVERY, "clean": True}))
    for seq in range(96, 106):
        (commits / record_name(seq)).unlink()
    report = BatchSink(None, str(tmp_path)).recover()
    assert report.head == 95 and report.high_water_mark == Lsn(95 * STEP + 0x10)
    gone = [layout.partition_name(s * STEP, s * STEP + 0x10) for s in range(96, 106)]
    assert sorted(report.removed_partitions) == sorted(gone + [f"{layout.TABLES}/public.t/{p}" for p in gone])


def test_a_checkpoint_of_an_older_pgpoll_is_folded_again_at_the_next_start(tmp_path: Path) -> None:
    build(tmp_path, CHECKPOINT_EVERY + 4)
    (tmp_path / layout.META / POINTER).unlink()
    path = tmp_path / layout.CHECKPOINTS / record_name(CHECKPOINT_EVERY)
    older = json.loads(path.read_text())
    del older["v1_records"]  # as pgpoll before the pointer wrote it
    path.write_text(json.dumps(older))
    assert CommitLog(LocalOutputFs(str(tmp_path))).needs_scan()
    BatchSink(None, str(tmp_path)).recover()
    assert json.loads((tmp_path / layout.META / POINTER).read_text())["seq"] == CHECKPOINT_EVERY + 4
    state = CommitLog(LocalOutputFs(str(tmp_path))).state()
    assert not state.listed and state.head == CHECKPOINT_EVERY + 4 and state.tail == ()
    assert not CommitLog(LocalOutputFs(str(tmp_path))).needs_scan()


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    """Old ones are of no use to start-up (it reads the newest), and a reader pointed at a gone one lists."""
    root = tmp_path / "out"
    build(root, (KEEP_CHECKPOINTS + 5) * CHECKPOINT_EVERY + 3)
    kept = sorted(p.name for p in (root / layout.CHECKPOINTS).glob("seq-*.json"))
    newest = (KEEP_CHECKPOINTS + 5) * CHECKPOINT_EVERY
    assert kept == [record_name(newest - i * CHECKPOINT_EVERY) for i in reversed(range(KEEP_CHECKPOINTS))]
    _fs, sink = start_up(root)
    state = sink.log.state()
    assert state.checkpoint is not None and state.checkpoint.seq == newest and state.head == newest + 3
    assert len(sink.log.partitions(state)) == newest + 3  # every batch still in the log's state


def test_a_checkpoint_listing_every_partition_stays_readable_and_the_next_one_folds_only_the_tables(
    tmp_path: Path,
) -> None:
    """Checkpoints written before 0.3 list every partition and no ``tables``: start-up, recovery's full pass
    and the per-table index read them, and the next checkpoint is the new, bounded kind."""
    build(tmp_path, 2 * CHECKPOINT_EVERY + 4)
    path = tmp_path / layout.CHECKPOINTS / record_name(2 * CHECKPOINT_EVERY)
    older = json.loads(path.read_text())
    del older["tables"]
    older["partitions"] = [[layout.partition_name(s * STEP, s * STEP + 0x10), ["public.t"]]
                           for s in range(1, 2 * CHECKPOINT_EVERY + 1)]
    path.write_text(json.dumps(older))
    (tmp_path / layout.META / POINTER).unlink()  # recovery's full pass runs, reading the old list
    report = BatchSink(None, str(tmp_path)).recover()
    assert report.removed_partitions == () and report.unrecorded == ()
    log = CommitLog(LocalOutputFs(str(tmp_path)))
    state = log.state()
    assert state.checkpoint is not None and state.checkpoint.partitions is not None
    assert state.table_index() == {"public.t": (state.head, str(Lsn(state.head * STEP + 0x10)))}
    assert len(log.partitions(state)) == state.head
    build(tmp_path, 3 * CHECKPOINT_EVERY + 1, first=state.head + 1)  # the next checkpoint folds from the old one
    newest = json.loads((tmp_path / layout.CHECKPOINTS / record_name(3 * CHECKPOINT_EVERY)).read_text())
    assert "partitions" not in newest
    assert newest["tables"] == {"public.t": [3 * CHECKPOINT_EVERY, str(Lsn(3 * CHECKPOINT_EVERY * STEP + 0x10))]}
