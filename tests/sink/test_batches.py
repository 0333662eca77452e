"""Publishing and recovery of batches on a real local filesystem through Spark's Hadoop FileSystem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.batches import BatchSink
from pgpoll.sink.commit_log import CommitLog


def _stage(spark: Any, sink: BatchSink, rows: int) -> str:
    staging = sink.staging_path()
    spark.range(rows).selectExpr("id AS commit_lsn").coalesce(1).write.parquet(staging)
    return staging


def test_publish_moves_the_batch_into_place_and_records_it(spark: Any, tmp_path: Path) -> None:
    sink = BatchSink(spark, str(tmp_path))
    staging = _stage(spark, sink, 3)
    record = sink.publish(staging, start=0x10, end=0x20, rows=3, slot="s", plugin="pgoutput")
    part = tmp_path / "changes" / "lsn_range=0000000000000010-0000000000000020"
    assert record.partition == part.name and part.is_dir()
    assert {p.name for p in part.glob("part-*")} == set(record.files) and record.files
    assert json.loads((part / layout.MANIFEST).read_text())["rows"] == 3
    assert not Path(staging.replace("file:", "")).exists()
    assert CommitLog(sink.fs).high_water_mark() == Lsn(0x20)


def test_a_batch_without_rows_is_recorded_without_a_partition(spark: Any, tmp_path: Path) -> None:
    sink = BatchSink(spark, str(tmp_path))
    record = sink.publish(sink.staging_path(), start=0x30, end=0x40, rows=0, slot="s", plugin="test_decoding")
    assert record.partition is None and not (tmp_path / "changes").exists()
    assert CommitLog(sink.fs).high_water_mark() == Lsn(0x40)


def test_recovery_adopts_a_complete_unrecorded_partition_and_removes_the_rest(spark: Any, tmp_path: Path) -> None:
    sink = BatchSink(spark, str(tmp_path))
    # a batch renamed into place whose commit-log record was never written (crash in between)
    complete = sink.publish(_stage(spark, sink, 2), start=0x100, end=0x200, rows=2, slot="s", plugin="pgoutput")
    (tmp_path / layout.COMMITS / layout.commit_record_name(0x200)).unlink()
    # a partition cut short: no manifest (a rename interrupted on a store without atomic rename)
    broken = tmp_path / "changes" / layout.partition_name(0x300, 0x400)
    broken.mkdir(parents=True)
    (broken / "part-00000.parquet").write_bytes(b"PAR1")
    # a partition whose manifest names a file that is missing
    short = tmp_path / "changes" / layout.partition_name(0x500, 0x600)
    short.mkdir(parents=True)
    (short / layout.MANIFEST).write_text(json.dumps({"files": {"part-1.parquet": 10}, "rows": 1}))
    # a staged batch that was never published
    leftover = _stage(spark, sink, 1)

    report = sink.recover(slot="s", plugin="pgoutput")

    assert report.adopted == (complete.partition,)
    assert set(report.removed_partitions) == {broken.name, short.name}
    assert report.removed_staging == 1 and not Path(leftover.replace("file:", "")).exists()
    assert report.high_water_mark == Lsn(0x200)
    records = CommitLog(sink.fs).records()
    assert [r.partition for r in records] == [complete.partition] and records[0].adopted
    assert not broken.exists() and not short.exists()


def test_publishing_over_an_existing_partition_is_refused(spark: Any, tmp_path: Path) -> None:
    sink = BatchSink(spark, str(tmp_path))
    (tmp_path / "changes" / layout.partition_name(1, 2)).mkdir(parents=True)
    with pytest.raises(SinkError, match="already exists"):
        sink.publish(_stage(spark, sink, 1), start=1, end=2, rows=1, slot="s", plugin="pgoutput")
