"""Which batches ``pgpoll compact`` merges (pure): groups of about the target, never across a gap, never the
newest record nor a young one, a unit at the target left alone, a small earlier merge extended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgpoll.housekeeping.compact_plan import eligible, groups, units
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.compactions import CompactionMap, CompactionRecord, Merge
from pgpoll.sink.commit.records import CommitRecord

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def record(seq: int, size: int = 10, *, kind: str = "batch", age: float = 7200.0) -> CommitRecord:
    lo, hi = seq * 100, seq * 100 + 50
    partition = layout.partition_name(lo, hi) if size else None
    return CommitRecord(start=str(Lsn(lo)), end=str(Lsn(hi)), rows=1 if size else 0, files=["f"] if size else [],
                        partition=partition, slot="s", plugin="pgoutput", seq=seq, kind=kind, bytes=size,
                        file_sizes={"f": size} if size else {}, committed_at=(NOW - timedelta(seconds=age)).isoformat())


def merge(first: int, last: int, size: int) -> Merge:
    return Merge(first=first, last=last, partition=layout.partition_name(first * 100, last * 100 + 50),
                 files={"m": size}, tables={}, rows=1, by=1, made_at=NOW.isoformat())


def test_groups_fill_the_target_and_stop_at_a_gap_and_at_a_large_unit() -> None:
    records = [record(1), record(2), record(3), record(4, kind="gap", size=0), record(5), record(6),
               record(7, size=100), record(8), record(9), record(10)]
    found = groups(units(records, []), target=25)
    assert [(g.first, g.last) for g in found] == [(1, 3), (5, 6), (8, 10)]
    assert found[0].partition == layout.partition_name(100, 350)


def test_a_single_small_unit_is_not_rewritten() -> None:
    assert groups(units([record(1), record(2, size=0), record(3, size=100)], []), target=25) == []


def test_the_newest_record_and_young_records_are_left_to_ingest() -> None:
    records = [record(1), record(2), record(3, age=10), record(4)]
    assert [r.seq for r in eligible(records, head=4, now=NOW, min_age=60)] == [1, 2]
    assert [r.seq for r in eligible(records, head=4, now=NOW, min_age=0)] == [1, 2, 3]


def test_a_small_merge_is_extended_and_its_records_are_not_taken_twice() -> None:
    earlier = merge(1, 3, 30)
    records = [record(s) for s in range(1, 7)]
    found = groups(units(records, [earlier]), target=1000)
    assert [(g.first, g.last, [u.merge is not None for u in g.units]) for g in found] == [
        (1, 6, [True, False, False, False])]


def test_the_map_resolves_each_record_to_the_merge_holding_its_rows() -> None:
    m = merge(2, 4, 30)
    compacted = CompactionMap(CompactionRecord(seq=1, merges=[m], made=[m.partition], removed={}, planned_on=0, run="r"))
    records = [record(s) for s in range(1, 7)]
    pieces = compacted.resolve(records)
    assert [(p.partition, p.merge is not None) for p in pieces] == [
        (records[0].partition, False), (m.partition, True), (records[4].partition, False), (records[5].partition, False)]
    assert compacted.covers_more(records[3:]) and not compacted.covers_more(records)
    assert compacted.covering(5) is None and compacted.covering(3) == m
