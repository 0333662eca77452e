"""Publishing and recovery of batches through Spark's Hadoop FileSystem (what ``hdfs:`` outputs use), on a local disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgpoll.errors import FenceLostError, SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink, Plan
from pgpoll.sink.commit.log import CommitLog, record_name
from pgpoll.sink.stores.hadoop import HadoopOutputFs


def _hadoop_sink(spark: Any, root: Path, run: str | None = None) -> BatchSink:
    """A sink on ``root`` through Hadoop's filesystem (a local output would get the OS's)."""
    return BatchSink(spark, str(root), fs=HadoopOutputFs(spark, str(root)), run=run)


def _stage(spark: Any, plan: Plan, rows: int) -> None:
    spark.range(rows).selectExpr("id AS commit_lsn").coalesce(1).write.parquet(plan.staging)


def _local(path: str) -> Path:
    return Path(path.replace("file:", "", 1))


def test_publish_moves_the_batch_into_place_and_records_it(spark: Any, tmp_path: Path) -> None:
    sink = _hadoop_sink(spark, tmp_path)
    assert isinstance(sink.fs, HadoopOutputFs) and sink.fs.fenced and sink.fs.scheme == "file"
    plan = sink.plan()
    _stage(spark, plan, 3)
    record = sink.publish(plan, start=0x10, end=0x20, rows=3, slot="s", plugin="pgoutput")
    part = tmp_path / "changes" / "lsn_range=0000000000000010-0000000000000020"
    assert record.partition == part.name and part.is_dir()
    assert {p.name for p in part.glob("part-*")} == set(record.files) and record.files
    assert record.bytes == sum(p.stat().st_size for p in part.glob("part-*")) > 0
    assert not _local(plan.staging).exists() and not list((tmp_path / layout.STAGING).iterdir())
    assert CommitLog(sink.fs).high_water_mark() == Lsn(0x20)
    assert (tmp_path / layout.COMMITS / record_name(1)).is_file()


def test_a_batch_without_rows_is_recorded_without_a_partition(spark: Any, tmp_path: Path) -> None:
    sink = _hadoop_sink(spark, tmp_path)
    record = sink.publish(sink.plan(), start=0x30, end=0x40, rows=0, slot="s", plugin="test_decoding")
    assert record.partition is None and not (tmp_path / "changes").exists()
    assert CommitLog(sink.fs).high_water_mark() == Lsn(0x40)


def test_the_hadoop_compare_and_set_on_file_roots_lets_one_run_win(spark: Any, tmp_path: Path) -> None:
    a, b = _hadoop_sink(spark, tmp_path, run="a"), _hadoop_sink(spark, tmp_path, run="b")
    plan_a, plan_b = a.plan(), b.plan()
    _stage(spark, plan_a, 2)
    _stage(spark, plan_b, 2)
    a.publish(plan_a, start=1, end=2, rows=2, slot="s", plugin="pgoutput")
    with pytest.raises(FenceLostError):
        b.publish(plan_b, start=1, end=3, rows=2, slot="s", plugin="pgoutput")
    assert not _local(plan_b.staging).exists()
    assert [r.run for r in CommitLog(b.fs).records()] == ["a"]


def test_recovery_through_hadoop_finishes_moves_and_removes_stale_staging(spark: Any, tmp_path: Path) -> None:
    sink = _hadoop_sink(spark, tmp_path)
    stale = _hadoop_sink(spark, tmp_path).plan()
    _stage(spark, stale, 1)
    plan = sink.plan()
    _stage(spark, plan, 2)
    real = sink.fs.rename

    def crash(src: str, dst: str) -> None:
        raise SystemExit("killed after the win")

    sink.fs.rename = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        sink.publish(plan, start=0x100, end=0x200, rows=2, slot="s", plugin="pgoutput")
    sink.fs.rename = real  # type: ignore[method-assign]

    report = _hadoop_sink(spark, tmp_path).recover()

    assert report.finished_moves == (record_name(1),) and report.removed_staging == (stale.id,)
    record = CommitLog(sink.fs).records()[0]
    part = tmp_path / "changes" / str(record.partition)
    assert {p.name for p in part.glob("part-*")} == set(record.files)
    assert not list((tmp_path / layout.STAGING).iterdir())
    assert report.high_water_mark == Lsn(0x200)


def test_publishing_over_an_existing_partition_is_refused(spark: Any, tmp_path: Path) -> None:
    sink = _hadoop_sink(spark, tmp_path)
    (tmp_path / "changes" / layout.partition_name(1, 2)).mkdir(parents=True)
    plan = sink.plan()
    _stage(spark, plan, 1)
    with pytest.raises(SinkError, match="already exists"):
        sink.publish(plan, start=1, end=2, rows=1, slot="s", plugin="pgoutput")
