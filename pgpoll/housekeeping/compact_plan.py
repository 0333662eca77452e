"""Which runs of committed batches ``pgpoll compact`` merges: pure, from the records and the compaction map.

A *unit* is what a merge can take in: one commit-log record with rows (its
own files), or an earlier merge that is still smaller than the target (so the
run after a small merge extends it rather than leaving a trail of small
merges). Units are taken in record order and cut into groups of about
``target`` bytes; a group of at least two units with files becomes a merge.
A group never spans a gap record (the changes on either side of a gap are
not continuous, and ``materialize`` builds nothing across one), never takes
the newest record (``ingest`` may still be moving its files, and its end is
where the next batch is planned from) nor a record younger than
``min_age`` (records are committed in order, so the young ones are a suffix).
A unit already at the target is left alone: rewriting it gains nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.compactions import Merge
from pgpoll.sink.commit.records import CommitRecord, parse_timestamp


@dataclass(frozen=True)
class Unit:
    """A record with rows (``record``) or an earlier merge (``merge``), covering records ``first``..``last``."""

    first: int
    last: int
    partition: str
    bytes: int
    record: CommitRecord | None = None
    merge: Merge | None = None

    @property
    def tables(self) -> list[str]:
        """The typed table directories it holds files of."""
        if self.merge is not None:
            return sorted(self.merge.tables)
        assert self.record is not None
        return sorted(self.record.tables)


@dataclass(frozen=True)
class Group:
    """Units merged into one partition, covering records ``first``..``last``."""

    units: tuple[Unit, ...]

    @property
    def first(self) -> int:
        return self.units[0].first

    @property
    def last(self) -> int:
        return self.units[-1].last

    @property
    def bytes(self) -> int:
        return sum(u.bytes for u in self.units)

    @property
    def partition(self) -> str:
        """``lsn_range=<first change>-<last change>``: the first unit's start and the last unit's end."""
        first = layout.parse_partition_name(self.units[0].partition)
        last = layout.parse_partition_name(self.units[-1].partition)
        assert first is not None and last is not None
        return layout.partition_name(int(first[0]), int(last[1]))

    @property
    def tables(self) -> list[str]:
        return sorted({t for u in self.units for t in u.tables})


def eligible(records: Sequence[CommitRecord], head: int, now: datetime, min_age: float) -> list[CommitRecord]:
    """``records`` (in order) up to the first that is the head or younger than ``min_age`` seconds (excluded)."""
    out: list[CommitRecord] = []
    for r in records:
        if r.seq >= head or (now - parse_timestamp(r.committed_at)).total_seconds() < min_age:
            break
        out.append(r)
    return out


def units(records: Sequence[CommitRecord], merges: Sequence[Merge]) -> list[Unit | None]:
    """The units of ``records`` in order (``None`` stands for a gap record: a boundary), each merge once."""
    by_first = {m.first: m for m in merges}
    covered = {s for m in merges for s in range(m.first, m.last + 1)}
    out: list[Unit | None] = []
    for r in records:
        if r.is_gap:
            out.append(None)
        elif r.seq in by_first:
            m = by_first[r.seq]
            out.append(Unit(m.first, m.last, m.partition, m.bytes, merge=m))
        elif r.seq not in covered and r.partition:
            out.append(Unit(r.seq, r.seq, r.partition, r.bytes, record=r))
    return out


def groups(found: Sequence[Unit | None], target: int) -> list[Group]:
    """``found`` cut into groups of about ``target`` bytes (see the module docstring)."""
    out: list[Group] = []
    current: list[Unit] = []
    size = 0

    def close() -> None:
        nonlocal size
        if len(current) >= 2:
            out.append(Group(tuple(current)))
        current.clear()
        size = 0

    for unit in found:
        if unit is None or unit.bytes >= target:
            close()  # a gap, or a unit at the target: nothing merges across it
            continue
        current.append(unit)
        size += unit.bytes
        if size >= target:
            close()
    close()
    return out


def lsn_bounds(group: Group) -> tuple[Lsn, Lsn]:
    """The smallest and largest ``commit_lsn`` a group's partition holds."""
    bounds = layout.parse_partition_name(group.partition)
    assert bounds is not None
    return bounds
