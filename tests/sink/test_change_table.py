"""The change log as a Delta table on a local output: an output written before it existed gains it, every record
is added once and in order however many processes complete it, and batches without rows add nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pgpoll.sink import layout
from pgpoll.sink.change_table import APP_ID, ChangeTable, committed_files
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.log import CommitLog
from tests.sink.conftest import publish_next, stage, write_v1


def _delta(out: Path) -> DeltaTable:
    return DeltaTable(str(out / layout.CHANGES))


def _listed(out: Path) -> set[str]:
    table = _delta(out)
    return {u.rsplit("/changes/", 1)[1] for u in table.file_uris()}  # checkout-paths: data
def test_an_output_written_before_the_delta_log_gains_it_with_every_committed_batch(tmp_path: Path) -> None:
    first = write_v1(tmp_path, 0x100, 0x200, files=2)  # written by pgpoll 0.x: no file sizes in the record
    second = write_v1(tmp_path, 0x201, 0x300)
    assert not (tmp_path / layout.CHANGES / "_delta_log").exists()
    sink = BatchSink(None, str(tmp_path))
    sink.recover()
    assert _delta(tmp_path).version() == 0 and _delta(tmp_path).transaction_version(APP_ID) == 2
    assert _listed(tmp_path) == {f"{first}/part-00000.parquet", f"{first}/part-00001.parquet", f"{second}/part-00000.parquet"}
    sizes = {a["path"]: a["size_bytes"] for a in pa.table(_delta(tmp_path).get_add_actions()).to_pylist()}
    assert set(sizes.values()) == {4}  # listed from the partitions
    plan = sink.plan()
    stage(plan, files=1)
    record = publish_next(sink, plan)
    assert _delta(tmp_path).version() == 1 and _delta(tmp_path).transaction_version(APP_ID) == record.seq == 3
    assert f"{record.partition}/{record.files[0]}" in _listed(tmp_path)
    BatchSink(None, str(tmp_path)).recover()
    assert _delta(tmp_path).version() == 1  # nothing added twice
    assert [p for p, _n, _s in committed_files(sink.fs)] == [first, first, second, str(record.partition)]


def test_batches_without_rows_add_no_version(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    stage(plan)
    publish_next(sink, plan)
    publish_next(sink, sink.plan(), rows=0)  # a heartbeat
    assert _delta(tmp_path).version() == 0 and CommitLog(sink.fs).head() == 2


def test_processes_completing_the_delta_log_together_add_each_record_once(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    for _ in range(6):
        plan = sink.plan()
        stage(plan)
        publish_next(sink, plan)
    (tmp_path / layout.CHANGES / "_delta_log").rename(tmp_path / "old_log")
    records = CommitLog(sink.fs).records()
    ChangeTable(sink.fs)._commit(records[:1], first=True)  # the Delta log holds record 1; crashes left out 2..6
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def complete() -> None:
        start.wait()
        try:
            ChangeTable(sink.fs).sync(CommitLog(sink.fs))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=complete) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _delta(tmp_path).transaction_version(APP_ID) == records[-1].seq
    assert _delta(tmp_path).version() == 5  # one version per record, none twice
    assert sorted(_listed(tmp_path)) == sorted(f"{r.partition}/{f}" for r in records for f in r.files)


def test_a_record_another_process_added_after_our_last_commit_is_not_added_again(tmp_path: Path) -> None:
    """The interleaving behind a duplicate version, played in order: no commit retry is needed to add a batch twice.

    Process B adds record 2 and refreshes its snapshot, which then also holds records 3..6 that process A added in
    the meantime. A commit on that snapshot sees no conflict (it is the newest version), so only the
    application transaction it holds can tell B that record 3 is done.
    """
    sink = BatchSink(None, str(tmp_path))
    for _ in range(6):
        plan = sink.plan()
        stage(plan)
        publish_next(sink, plan)
    (tmp_path / layout.CHANGES / "_delta_log").rename(tmp_path / "old_log")
    records = CommitLog(sink.fs).records()
    ChangeTable(sink.fs)._commit(records[:1], first=True)
    b = ChangeTable(sink.fs)
    assert b.added() == 1
    assert b._commit(records[1:2], first=False) == [2]  # B's snapshot: version 1, records 1..2
    assert ChangeTable(sink.fs).sync(CommitLog(sink.fs)) == [3, 4, 5, 6]  # A: versions 2..5
    b._load()  # B's snapshot: version 5, records 1..6
    assert b._commit(records[2:], first=False) == []
    assert _delta(tmp_path).version() == 5 and _delta(tmp_path).transaction_version(APP_ID) == 6
    assert sorted(_listed(tmp_path)) == sorted(f"{r.partition}/{f}" for r in records for f in r.files)
