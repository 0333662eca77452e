"""The retention floor: which commit-log records (and their batches) ``pgpoll retain`` has removed on purpose.

``PATH/_pgpoll/retention.json`` says that records ``1..seq`` may be gone, with
their partitions under ``changes/`` and ``tables/``, their Delta ``add``
actions (removed in one Delta version), and nothing else: gap records are
kept (materialize reads the newest by number), so are the checkpoints and
every record after ``seq``. On a compacted output the floor never cuts a merge of ``pgpoll compact``
(:mod:`pgpoll.sink.commit.compactions`): merges wholly below it are removed
with their records. It is written **before** any file is deleted,
and only ever raised, so that everything reading the log knows records below
it are gone on purpose rather than lost:

* start-up (:mod:`pgpoll.sink.commit.log`) reads the newest checkpoint and
  probes the records after it: ``pgpoll retain`` first writes a checkpoint
  at the head, which folds every record it removes, and never removes that
  checkpoint's record, so start-up stays a bounded read (a pointer left at an
  older checkpoint lists, as any stale pointer does);
* recovery's full pass and plain reads of local outputs read the folded
  records by number from the floor up, not from record 1;
* :class:`pgpoll.sink.commit.history.History` never reads below it, and
  refuses (:class:`pgpoll.errors.ConfigError`, exit 2) a table whose
  position is behind the removed records that named it (``tables``: for each
  typed table the newest removed record naming it, its ``end`` and the
  largest ``xid_max`` of the removed records naming it, so that materialize
  can tell a snapshot that holds them all from one that does not);
* a retention run killed between the floor and the deletions is finished by
  the next one: ``done`` is False until every file of records ``start..seq``
  is deleted, and the next run deletes what is left of them first.

The file is a small JSON document rewritten whole (``write_text``); only one
``pgpoll retain`` runs per output at a time (its lease,
``_pgpoll/leases/retain.json``), and the floor only ever rises.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.records import utc_now
from pgpoll.sink.stores.output_fs import OutputFs

FLOOR_FILE = f"{layout.META}/retention.json"
"""Under the output: the retention floor (see the module docstring)."""


@dataclass(frozen=True)
class RetentionFloor:
    """Records ``1..seq`` may be gone (``end``: record ``seq``'s end); ``start`` is where the run that raised it
    to ``seq`` began deleting (its records ``start..seq`` are deleted once ``done``)."""

    seq: int
    end: str
    start: int = 1
    done: bool = False
    tables: dict[str, list[Any]] = field(default_factory=dict)
    """Typed table directory: ``[seq, end, xid_max]`` of the removed records naming it (newest seq and end,
    largest ``xid_max``; None when a removed record did not know its xids)."""
    data_seq: int = 0
    """The newest removed record that wrote rows (0: none)."""
    run: str | None = None
    written_at: str = field(default_factory=utc_now)

    @property
    def end_lsn(self) -> Lsn:
        return Lsn.parse(self.end)

    def removed(self, table: str) -> tuple[int, Lsn, int | None] | None:
        """``(seq, end, xid_max)`` of the removed records naming typed table ``table`` (None: none removed)."""
        found = self.tables.get(table)
        if found is None:
            return None
        return int(found[0]), Lsn.parse(str(found[1])), (int(found[2]) if found[2] is not None else None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RetentionFloor:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("seq"), int):
            raise ValueError("not a retention floor")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_floor(fs: OutputFs) -> RetentionFloor | None:
    """The output's retention floor (None: nothing was ever removed); :class:`SinkError` when it is damaged."""
    found = fs.read_tagged(fs.path(FLOOR_FILE))
    if found is None:
        return None
    try:
        return RetentionFloor.from_json(found[0])
    except (ValueError, TypeError) as exc:
        raise SinkError(f"the retention floor {fs.path(FLOOR_FILE)} is unreadable: {exc}",
                        "restore it from backup: it says which commit-log records were removed on purpose") from None


def write_floor(fs: OutputFs, floor: RetentionFloor) -> None:
    """Write ``floor`` (never lower than the one there: a lower one is a bug, refused)."""
    current = read_floor(fs)
    if current is not None and floor.seq < current.seq:
        raise SinkError(f"retention floor {floor.seq} is below the output's {current.seq}",
                        "rerun pgpoll retain")  # pragma: no cover (the planner starts from the current floor)
    fs.mkdirs(fs.path(layout.META))
    fs.write_text(fs.path(FLOOR_FILE), floor.to_json())


def merge_removed(tables: dict[str, list[Any]], table: str, seq: int, end: str, xid_max: int | None,
                  known: bool) -> None:
    """Fold one removed record naming ``table`` into ``tables`` (``known``: the record knew its xids)."""
    before = tables.get(table)
    xid: int | None = xid_max if known else None
    if before is not None:
        older = before[2]
        xid = None if older is None or xid is None else max(int(older), xid)
        if int(before[0]) > seq:
            seq, end = int(before[0]), str(before[1])
    tables[table] = [seq, end, xid]
