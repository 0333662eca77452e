"""Publishing behind the fence on a real object store (SeaweedFS): files written once at their final keys, the
upload manifest, losers and killed runs cleaned up by recovery, and the change log's Delta table."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from pgpoll.errors import FenceLostError
from pgpoll.sink import layout
from pgpoll.sink.change_table import APP_ID, ChangeTable
from pgpoll.sink.commit.batches import BatchSink, Plan
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.uploads import UploadedBatch, manifest_path, upload_batch
from pgpoll.testing.object_stores import StoreBucket


def _upload(sink: BatchSink, plan: Plan, tmp: Path, *, span: int = 0x10, files: int = 2,
            tables: dict[str, int] | None = None) -> UploadedBatch:
    """What the batch task does on a store: spill files locally, then upload them under the plan's manifest."""
    base = int(plan.high_water_mark) if plan.high_water_mark is not None else 0
    spill = tmp / plan.id
    (spill / "envelope").mkdir(parents=True)
    for i in range(files):
        (spill / "envelope" / f"part-{i:05d}-{plan.id}.parquet").write_bytes(b"PAR1" + bytes(10 + i))
    for name, count in (tables or {}).items():
        (spill / "tables" / name).mkdir(parents=True)
        for i in range(count):
            (spill / "tables" / name / f"part-{i:05d}-{plan.id}.parquet").write_bytes(b"PAR1" + bytes(20 + i))
    return upload_batch(sink.fs, plan.id, str(spill / "envelope"), str(spill / "tables") if tables else None,
                        layout.partition_name(base + 1, base + span))


def _publish(sink: BatchSink, plan: Plan, uploaded: UploadedBatch, *, span: int = 0x10) -> object:
    base = int(plan.high_water_mark) if plan.high_water_mark is not None else 0
    return sink.publish(plan, start=base + 1, end=base + span, rows=3, slot="s", plugin="pgoutput", uploaded=uploaded)


def _keys(sink: BatchSink, *parts: str) -> set[str]:
    listed = sink.fs.list_files(sink.fs.path(*parts))
    return {name for name, _size in listed}


def _delta_files(sink: BatchSink) -> set[str]:
    table = ChangeTable(sink.fs)
    dt = DeltaTable(table.uri or "", storage_options=table.options)
    return {uri.rsplit("/changes/", 1)[1] for uri in dt.file_uris()}  # checkout-paths: data
def test_the_winner_publishes_in_place_and_its_delta_version_lists_the_batch(s3_bucket: StoreBucket, tmp_path: Path) -> None:
    sink = BatchSink(None, s3_bucket.url, run="a")
    assert sink.fs.direct_writes
    plan = sink.plan()
    uploaded = _upload(sink, plan, tmp_path, tables={"public.t": 1})
    assert sink.fs.exists(manifest_path(sink.fs, plan.id))
    record = _publish(sink, plan, uploaded)
    assert record.in_place is True and record.files == sorted(uploaded.files)
    partition = record.partition
    assert _keys(sink, layout.CHANGES, partition) == set(uploaded.files)
    assert _keys(sink, layout.TABLES, "public.t", partition) == set(uploaded.tables["public.t"])
    assert _keys(sink, layout.STAGING) == set()  # plan and manifest gone, nothing was moved
    assert _delta_files(sink) == {f"{partition}/{name}" for name in uploaded.files}
    assert ChangeTable(sink.fs).added() == 1


def test_a_loser_deletes_what_it_uploaded(s3_bucket: StoreBucket, tmp_path: Path) -> None:
    a, b = BatchSink(None, s3_bucket.url, run="a"), BatchSink(None, s3_bucket.url, run="b")
    plan_a, plan_b = a.plan(), b.plan()
    up_a = _upload(a, plan_a, tmp_path)
    up_b = _upload(b, plan_b, tmp_path)  # the same range: the same partition, other file names
    assert up_a.partition == up_b.partition
    won = _publish(a, plan_a, up_a)
    with pytest.raises(FenceLostError):
        _publish(b, plan_b, up_b)
    assert _keys(a, layout.CHANGES, won.partition) == set(up_a.files)
    assert _keys(a, layout.STAGING) == set() and [r.run for r in CommitLog(a.fs).records()] == ["a"]
    assert _delta_files(a) == {f"{up_a.partition}/{name}" for name in up_a.files}


def test_recovery_deletes_a_killed_runs_uploads_once_its_plan_is_stale(s3_bucket: StoreBucket, tmp_path: Path) -> None:
    killed, winner = BatchSink(None, s3_bucket.url, run="k"), BatchSink(None, s3_bucket.url, run="w")
    plan_k = killed.plan()
    up_k = _upload(killed, plan_k, tmp_path, tables={"public.t": 2})  # ... then SIGKILL: no record
    plan_w = winner.plan()
    assert winner.last_recovery is not None and plan_k.id in winner.last_recovery.kept_staging  # planned on the head
    _publish(winner, plan_w, _upload(winner, plan_w, tmp_path, span=0x20), span=0x20)
    report = BatchSink(None, s3_bucket.url).recover()
    assert plan_k.id in report.removed_staging
    assert not any(name in _keys(winner, layout.CHANGES, up_k.partition) for name in up_k.files)
    assert _keys(winner, layout.TABLES, "public.t") == set() and _keys(winner, layout.STAGING) == set()


def test_an_upload_that_finds_its_plan_gone_stale_deletes_its_files(s3_bucket: StoreBucket, tmp_path: Path) -> None:
    slow, fast = BatchSink(None, s3_bucket.url, run="slow"), BatchSink(None, s3_bucket.url, run="fast")
    plan_slow = slow.plan()
    plan_fast = fast.plan()
    _publish(fast, plan_fast, _upload(fast, plan_fast, tmp_path))
    fast.plan()  # its recovery removes the slow plan (stale: record 1 is fast's)
    with pytest.raises(FenceLostError):
        _upload(slow, plan_slow, tmp_path / "slow")  # the manifest it wrote is gone after its uploads
    partition = layout.partition_name(1, 0x10)
    assert all(f"-{plan_slow.id}." not in name for name in _keys(slow, layout.CHANGES, partition))


def test_recovery_adds_a_record_a_crash_left_out_of_the_delta_log(s3_bucket: StoreBucket, tmp_path: Path) -> None:
    sink = BatchSink(None, s3_bucket.url, run="a")
    first = sink.plan()
    _publish(sink, first, _upload(sink, first, tmp_path))
    second = sink.plan()
    with pytest.MonkeyPatch.context() as patch:  # killed right after its record
        patch.setattr(ChangeTable, "sync", lambda self, log, state=None: [])
        _publish(sink, second, _upload(sink, second, tmp_path, span=0x30), span=0x30)
    assert ChangeTable(sink.fs).added() == 1
    BatchSink(None, s3_bucket.url).recover()
    table = ChangeTable(sink.fs)
    assert table.added() == 2
    dt = DeltaTable(table.uri or "", storage_options=table.options)
    assert dt.version() == 1 and dt.transaction_version(APP_ID) == 2  # one version per batch, in order
    BatchSink(None, s3_bucket.url).recover()
    assert DeltaTable(table.uri or "", storage_options=table.options).version() == 1  # nothing added twice
