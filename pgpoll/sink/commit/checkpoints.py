"""Commit-log checkpoints: the fold of records 1..N that start-up reads instead of them, and the pointer to the newest.

Under ``PATH/_pgpoll/``::

    checkpoints/seq-<16 digits>.json a fold of records 1..<seq>
    newest-checkpoint.json           the pointer: {"seq": N, "clean": ...}

**Checkpoints** fold records 1..N (high-water mark, totals, and for each
typed table the newest record naming it) so that start-up reads the newest
checkpoint and the records after it, not the whole history. A checkpoint's
size depends on the number of tables, not of batches: checkpoints written
before 0.3 also listed every partition ever written (``partitions``), a
document that grew with the history and was rewritten every
:data:`CHECKPOINT_EVERY` records; they stay readable (their ``tables`` is
derived from that list), and new ones omit ``partitions`` so that an older
pgpoll takes them for unreadable and lists the log instead (its recovery
would otherwise take every partition for an unrecorded one). A checkpoint is written with the same
create-if-absent in its own directory, so it never competes with a batch for
a sequence number; two runs writing the same fold write the same content, and
a kill mid-write leaves nothing (the file appears whole or not at all). A
checkpoint is only written over records whose data files are all in place.
The pointer names the newest checkpoint; it is only a hint (how start-up uses
it, and falls back to listing, is :mod:`pgpoll.sink.commit.log`'s).

Everything here is importable from :mod:`pgpoll.sink.commit.log` too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pgpoll.lsn import Lsn
from pgpoll.sink.commit.records import VERSION, CommitRecord, parse_timestamp, utc_now

CHECKPOINT_EVERY = 50
"""A checkpoint is written once this many records follow the newest one."""
KEEP_CHECKPOINTS = 8
"""Checkpoints kept; older ones are deleted once a newer one is written (start-up reads only the newest)."""
POINTER = "newest-checkpoint.json"
"""Under ``_pgpoll/``: the newest checkpoint's ``seq`` (a hint; see :mod:`pgpoll.sink.commit.log`)."""


@dataclass(frozen=True)
class Checkpoint:
    """The fold of records 1..``seq``: what start-up needs without reading them.

    ``tables`` maps each typed table directory to ``[seq, end]``: a record at
    or after the newest one that names it, and that record's ``end`` (exact
    for records folded by this version; for tables folded from an older
    checkpoint the older checkpoint's own ``seq`` and high-water mark, an upper
    bound that is just as safe to search below). ``data_seq`` is the newest
    record that wrote rows (0: none), so that the change table's Delta log
    knows it lacks nothing without reading the heartbeats after it. ``gap_seq`` is the newest gap
record (``pgpoll resync``; 0 or None: none, as in every checkpoint written before gap records existed), so
``materialize`` finds it without reading the records. ``partitions`` lists
    ``[partition, [typed table, ...]]`` of every record that wrote rows, in
    order, only in checkpoints written before 0.3 (None in newer ones: the
    records hold them). ``v1_records`` says how many of the records are
    version-1 ones (None: written by a pgpoll that did not say).
    """

    seq: int
    high_water_mark: str | None
    records: int
    rows: int
    bytes: int
    slots: list[str]
    tables: dict[str, list[Any]] | None = None
    data_seq: int | None = None
    gap_seq: int | None = None
    partitions: list[list[Any]] | None = None
    last_commit_ts: str | None = None
    last_committed_at: str | None = None
    run: str | None = None
    created_at: str = field(default_factory=utc_now)
    version: int = VERSION
    kind: str = "checkpoint"
    v1_records: int | None = None

    def to_json(self) -> str:
        """The checkpoint as one JSON document (``partitions`` left out when None: see the module docstring)."""
        data = asdict(self)
        if self.partitions is None:
            del data["partitions"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        """Parse a checkpoint written by :meth:`to_json`, or by an older pgpoll (``partitions``, no ``tables``)."""
        data = json.loads(text)
        if "partitions" not in data and "tables" not in data:
            raise ValueError("a checkpoint with neither tables nor partitions")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def newest_data(self) -> int:
        """``data_seq``; for an older checkpoint its own ``seq`` when it lists a partition (an upper bound)."""
        if self.data_seq is not None:
            return self.data_seq
        return self.seq if self.partitions else 0

    def table_index(self) -> dict[str, tuple[int, str]]:
        """``tables`` as ``{table directory: (seq, end)}``; for an older checkpoint derived from ``partitions``."""
        if self.tables is not None:
            return {t: (int(v[0]), str(v[1])) for t, v in self.tables.items()}
        end = self.high_water_mark or "0/0"
        return {str(t): (self.seq, end) for p in self.partitions or [] for t in p[1]}


def _later(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if parse_timestamp(a) >= parse_timestamp(b) else b


@dataclass(frozen=True)
class LogState:
    """The commit log as start-up sees it: the newest checkpoint and the records after it.

    ``head`` is the last ``seq`` (0 for a new output); ``v1_names`` the
    version-1 file names in LSN order (record ``i`` is ``v1_names[i-1]``);
    ``listed`` whether ``commits/`` was listed (False: found from the pointer,
    the checkpoint then says there are no version-1 records).
    """

    head: int
    checkpoint: Checkpoint | None
    tail: tuple[CommitRecord, ...]
    v1_names: tuple[str, ...] = ()
    listed: bool = True

    @property
    def high_water_mark(self) -> Lsn | None:
        """The largest ``end`` of any record (None for a new output)."""
        ends = [r.end_lsn for r in self.tail]
        if self.checkpoint is not None and self.checkpoint.high_water_mark is not None:
            ends.append(Lsn.parse(self.checkpoint.high_water_mark))
        return max(ends) if ends else None

    def prev_of(self, seq: int) -> int | str | None:
        """What record ``seq`` names as its predecessor."""
        before = seq - 1
        if before <= 0:
            return None
        if before <= len(self.v1_names):
            return self.v1_names[before - 1]
        return before

    def partitions(self) -> list[tuple[str, list[str]]]:
        """``(partition, typed tables)`` of every record that wrote rows, in order.

        Only when the checkpoint lists them (written before 0.3) or there is
        none; :meth:`pgpoll.sink.commit.log.CommitLog.partitions` also reads
        the records a newer checkpoint folds.
        """
        cp = self.checkpoint
        if cp is not None and cp.partitions is None:
            raise ValueError("this checkpoint does not list partitions: read them with CommitLog.partitions")
        out = [(str(p[0]), list(p[1])) for p in cp.partitions or []] if cp else []
        return out + [(r.partition, list(r.tables)) for r in self.tail if r.partition]

    def newest_data(self) -> int:
        """The newest record that wrote rows, or one after it (0: none): what the change table's Delta log needs."""
        found = [r.seq for r in self.tail if r.partition]
        if found:
            return max(found)
        return self.checkpoint.newest_data() if self.checkpoint is not None else 0

    def newest_gap(self) -> int:
        """The newest gap record's ``seq`` (0: none)."""
        found = [r.seq for r in self.tail if r.is_gap]
        if found:
            return max(found)
        return (self.checkpoint.gap_seq or 0) if self.checkpoint is not None else 0

    def table_index(self) -> dict[str, tuple[int, str]]:
        """Each typed table directory: ``(seq, end)`` of a record at or after the newest that names it."""
        index = self.checkpoint.table_index() if self.checkpoint is not None else {}
        for r in self.tail:
            for t in r.tables:
                index[t] = (r.seq, r.end)
        return index

    def fold(self, upto: int, run: str | None = None) -> Checkpoint:
        """The checkpoint of records 1..``upto`` (``upto`` at least the current checkpoint's seq)."""
        cp = self.checkpoint
        records = [r for r in self.tail if r.seq <= upto]
        hwm = max([r.end_lsn for r in records] + ([Lsn.parse(cp.high_water_mark)] if cp and cp.high_water_mark else []),
                  default=None)
        last_ts, last_at = (cp.last_commit_ts, cp.last_committed_at) if cp else (None, None)
        for r in records:
            last_ts, last_at = _later(last_ts, r.last_commit_ts), _later(last_at, r.committed_at)
        return Checkpoint(
            seq=upto, high_water_mark=str(hwm) if hwm is not None else None,
            records=(cp.records if cp else 0) + len(records), rows=(cp.rows if cp else 0) + sum(r.rows for r in records),
            bytes=(cp.bytes if cp else 0) + sum(r.bytes for r in records),
            tables={t: [s, e] for t, (s, e) in sorted(replace(self, tail=tuple(records)).table_index().items())},
            data_seq=replace(self, tail=tuple(records)).newest_data(),
            gap_seq=replace(self, tail=tuple(records)).newest_gap(),
            slots=sorted(set(cp.slots if cp else []) | {r.slot for r in records}),
            last_commit_ts=last_ts, last_committed_at=last_at, run=run,
            v1_records=len(self.v1_names) if self.listed or cp is None else cp.v1_records,
        )
