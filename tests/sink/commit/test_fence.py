"""Publishing behind the fence, and fenced recovery, on a real local filesystem without a JVM."""

from __future__ import annotations

import itertools
import json
import random
import threading
from pathlib import Path

import pytest

from pgpoll.cli.exitcodes import exit_code_for
from pgpoll.errors import FenceLostError, SinkError, SlotBusyError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit import batches
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.log import CommitLog, record_name
from tests.sink.conftest import publish_next, stage, staging_names, write_v1


def test_plan_writes_its_plan_file_before_anything_is_staged(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path), run="r1")
    plan = sink.plan()
    assert staging_names(tmp_path) == {f"{plan.id}.plan.json"} and not Path(plan.staging).exists()
    body = json.loads((tmp_path / layout.STAGING / f"{plan.id}.plan.json").read_text())
    assert body["planned_on"] == 0 and body["run"] == "r1" and body["created"] == plan.created
    assert (plan.planned_on, plan.seq, plan.high_water_mark, plan.prev) == (0, 1, None, None)


def test_the_winner_moves_its_files_into_place_after_its_record(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    typed = stage(plan, files=2, tables={"public.t": 2})
    record = publish_next(sink, plan, tables=typed)
    part = tmp_path / layout.CHANGES / str(record.partition)
    assert {p.name for p in part.glob("part-*")} == set(record.files) and len(record.files) == 2
    assert {p.name: p.stat().st_size for p in part.glob("part-*")} == record.file_sizes
    typed_part = tmp_path / layout.TABLES / "public.t" / str(record.partition)
    assert {p.name for p in typed_part.glob("part-*")} == set(record.table_files["public.t"])
    assert staging_names(tmp_path) == set()  # staging and plan file gone
    assert record.partition == layout.partition_name(1, 0x10)


def test_a_batch_without_rows_is_recorded_without_a_partition(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    record = publish_next(sink, plan, rows=0)
    assert record.partition is None and record.files == [] and not (tmp_path / layout.CHANGES).exists()
    assert CommitLog(sink.fs).high_water_mark() == Lsn(0x10) and staging_names(tmp_path) == set()


def test_a_lost_compare_and_set_removes_only_the_losers_staging(tmp_path: Path) -> None:
    a, b = BatchSink(None, str(tmp_path), run="a"), BatchSink(None, str(tmp_path), run="b")
    plan_a, plan_b = a.plan(), b.plan()
    assert plan_a.planned_on == plan_b.planned_on == 0
    stage(plan_a)
    stage(plan_b, tables={"public.t": 1})
    third = b.plan()  # a later plan of the loser's own stays alone too (it is planned on the head)
    won = publish_next(a, plan_a, span=0x20)
    with pytest.raises(FenceLostError) as lost:
        publish_next(b, plan_b, span=0x30)
    assert isinstance(lost.value, SlotBusyError) and exit_code_for(lost.value) == 3
    assert "record 1" in str(lost.value)
    assert staging_names(tmp_path) == {f"{third.id}.plan.json"}
    assert [r.run for r in CommitLog(a.fs).records()] == ["a"] and won.seq == 1
    assert [p.name for p in (tmp_path / layout.CHANGES).glob("lsn_range=*")] == [won.partition]
    assert not (tmp_path / layout.TABLES).exists()


def test_a_plan_whose_staging_was_removed_as_stale_is_told_it_lost(tmp_path: Path) -> None:
    a, b = BatchSink(None, str(tmp_path)), BatchSink(None, str(tmp_path))
    plan_b = b.plan()
    plan_a = a.plan()
    stage(plan_a)
    publish_next(a, plan_a)
    a.plan()  # a's recovery removes b's staging: planned on record 0, and record 1 is a's
    assert not (tmp_path / layout.STAGING / f"{plan_b.id}.plan.json").exists()
    with pytest.raises(FenceLostError):
        publish_next(b, plan_b)  # its staged files are gone (Spark's write would have failed)
    with pytest.raises(FenceLostError):
        b.ensure_current(plan_b)


def test_publishing_over_an_existing_unrecorded_partition_is_refused(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    stage(plan)
    (tmp_path / layout.CHANGES / layout.partition_name(1, 0x10)).mkdir(parents=True)
    with pytest.raises(SinkError, match="already exists"):
        publish_next(sink, plan)
    assert not (tmp_path / layout.COMMITS).exists()


def test_recovery_keeps_staging_planned_on_the_head_and_removes_stale_staging(tmp_path: Path) -> None:
    a, live = BatchSink(None, str(tmp_path)), BatchSink(None, str(tmp_path))
    stale = live.plan()
    stage(stale, tables={"public.t": 1})
    plan = a.plan()
    stage(plan)
    publish_next(a, plan)
    live_plan = live.plan()  # (this recovery removes `stale`: planned on 0, head is 1)
    assert not Path(stale.staging).exists() and not Path(stale.tables_staging).exists()
    stage(live_plan)
    old = tmp_path / layout.STAGING / "0123456789abcdef"  # from an older pgpoll: no plan file
    old.mkdir()
    (old / "part-0.parquet").write_bytes(b"x")

    report = BatchSink(None, str(tmp_path)).recover()

    assert report.kept_staging == (live_plan.id,) and report.removed_staging == (old.name,)
    assert Path(live_plan.staging).exists() and report.head == 1 and report.fenced
    assert report.as_json()["adopted"] == [] and report.as_json()["kept_staging"] == [live_plan.id]
    publish_next(live, live_plan)  # the live run still wins record 2


def test_recovery_finishes_the_moves_of_a_record_whose_publisher_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    typed = stage(plan, files=3, tables={"public.t": 2})
    monkeypatch.setattr(batches, "finish_moves", lambda fs, record: (_ for _ in ()).throw(SystemExit("killed")))
    with pytest.raises(SystemExit):
        publish_next(sink, plan, tables=typed)
    monkeypatch.undo()
    assert (tmp_path / layout.COMMITS / record_name(1)).exists() and not (tmp_path / layout.CHANGES).exists()
    # a part of the move was done before the kill
    part = tmp_path / layout.CHANGES / layout.partition_name(1, 0x10)
    part.mkdir(parents=True)
    first = sorted(Path(plan.staging).glob("part-*"))[0]
    first.rename(part / first.name)

    report = BatchSink(None, str(tmp_path)).recover()

    record = CommitLog(sink.fs).records()[0]
    assert report.finished_moves == (record_name(1),)
    assert {p.name for p in part.glob("part-*")} == set(record.files) and len(record.files) == 3
    assert {p.name for p in (tmp_path / layout.TABLES / "public.t" / str(record.partition)).iterdir()} == set(
        record.table_files["public.t"]
    )
    assert staging_names(tmp_path) == set()
    assert BatchSink(None, str(tmp_path)).recover().finished_moves == ()  # idempotent


def test_a_record_whose_files_are_gone_everywhere_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = BatchSink(None, str(tmp_path))
    plan = sink.plan()
    stage(plan, files=2)
    monkeypatch.setattr(batches, "finish_moves", lambda fs, record: None)
    publish_next(sink, plan)
    monkeypatch.undo()
    next(Path(plan.staging).glob("part-*")).unlink()
    with pytest.raises(SinkError, match="neither staged nor"):
        BatchSink(None, str(tmp_path)).recover()


def test_version_1_leftovers_above_the_hwm_are_removed_and_below_it_set_aside(tmp_path: Path) -> None:
    write_v1(tmp_path, 0x100, 0x200)
    recorded = write_v1(tmp_path, 0x201, 0x300)
    # a version-1 crash between rename and record: above the high-water mark (the slot still holds it)
    above = tmp_path / layout.CHANGES / layout.partition_name(0x301, 0x400)
    above.mkdir()
    typed_above = tmp_path / layout.TABLES / "public.t" / layout.partition_name(0x301, 0x400)
    typed_above.mkdir(parents=True)
    # no crash leaves these: at or below the high-water mark, and named by no record
    below = write_v1(tmp_path, 0x10, 0x20)
    (tmp_path / layout.COMMITS / layout.commit_record_name(0x20)).unlink()
    typed_below = tmp_path / layout.TABLES / "public.t" / layout.partition_name(0x10, 0x20)
    typed_below.mkdir(parents=True)
    (tmp_path / layout.TABLES / "public.t" / "notes").mkdir()

    report = BatchSink(None, str(tmp_path)).recover()

    assert set(report.removed_partitions) == {above.name, f"{layout.TABLES}/public.t/{above.name}"}
    assert set(report.unrecorded) == {f"{layout.CHANGES}/{below}", f"{layout.TABLES}/public.t/{below}"}
    assert not above.exists() and not typed_above.exists() and not typed_below.exists()
    assert (tmp_path / layout.UNRECORDED / layout.CHANGES / below / "part-00000.parquet").exists()
    assert sorted(p.name for p in (tmp_path / layout.CHANGES).glob("lsn_range=*")) == sorted(
        [layout.partition_name(0x100, 0x200), recorded]
    )
    assert (tmp_path / layout.TABLES / "public.t" / "notes").exists()  # only partitions are looked at
    assert report.high_water_mark == Lsn(0x300) and report.adopted == ()


def test_the_calls_of_earlier_versions_still_work(tmp_path: Path) -> None:
    sink = BatchSink(None, str(tmp_path))
    staging = sink.staging_path()
    Path(staging).mkdir()
    (Path(staging) / "part-0.parquet").write_bytes(b"PAR1")
    record = sink.publish(staging, start=1, end=2, rows=1, slot="s", plugin="pgoutput")
    assert record.seq == 1 and record.files == ["part-0.parquet"]
    other = sink.staging_path()
    sink.discard(other)
    assert staging_names(tmp_path) == set()


def test_racing_runs_commit_every_range_exactly_once(tmp_path: Path) -> None:
    """Four runs publish batches as fast as they can; losers retry on the new head."""
    errors: list[BaseException] = []
    wins: dict[str, int] = {}
    losses: dict[str, int] = {}

    def run(name: str) -> None:
        sink = BatchSink(None, str(tmp_path), run=name)
        rng = random.Random(name)
        try:
            while True:
                plan = sink.plan()
                if plan.planned_on >= 40:
                    sink.discard(plan)
                    return
                try:
                    stage(plan, files=rng.randint(1, 3))
                    publish_next(sink, plan, span=rng.randint(2, 50))
                    wins[name] = wins.get(name, 0) + 1
                except FenceLostError:
                    losses[name] = losses.get(name, 0) + 1
                except FileNotFoundError:  # its staging removed as stale while "Spark" wrote it
                    with pytest.raises(FenceLostError):
                        sink.ensure_current(plan)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"run{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    records = CommitLog(BatchSink(None, str(tmp_path)).fs).records()
    assert [r.seq for r in records][:40] == list(range(1, 41)) and sum(wins.values()) == len(records)
    for before, after in itertools.pairwise(records):
        assert after.prev == before.seq and Lsn.parse(after.start) > before.end_lsn  # ranges never overlap
    on_disk = {p.name: {f.name for f in p.glob("part-*")} for p in (tmp_path / layout.CHANGES).glob("lsn_range=*")}
    assert on_disk == {r.partition: set(r.files) for r in records}
    BatchSink(None, str(tmp_path)).plan()  # a last plan: nothing but its own plan file is left in staging
    assert len(staging_names(tmp_path)) == 1
