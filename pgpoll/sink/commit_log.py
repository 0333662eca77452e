"""pgpoll's commit log: one JSON record per committed batch under ``PATH/_pgpoll/commits/``.

A batch counts as committed when its record exists. The high-water mark —
the largest ``end`` of any record — is the LSN up to which the output holds
every change; the slot is re-advanced to it at the start of each run, and no
change with a ``commit_lsn`` at or below it is ever written again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.filesystem import OutputFilesystem


@dataclass(frozen=True)
class CommitRecord:
    """One committed batch.

    ``start``/``end`` are the smallest and largest commit LSN the batch
    accounts for (``end`` is where the slot is advanced to); ``partition`` is
    the directory under ``changes/`` (None when the batch wrote no rows, e.g.
    only a heartbeat or filtered transactions); ``last_commit_ts`` is the
    commit time of the newest change written (ISO 8601, UTC), for lag in time;
    ``tables`` the typed tables (``tables/<dir>/<partition>``) the batch wrote.
    """

    start: str
    end: str
    rows: int
    files: list[str]
    partition: Optional[str]
    slot: str
    plugin: str
    committed_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    adopted: bool = False
    last_commit_ts: Optional[str] = None
    tables: list[str] = field(default_factory=list)

    @property
    def end_lsn(self) -> Lsn:
        """``end`` as an Lsn."""
        return Lsn.parse(self.end)

    def to_json(self) -> str:
        """The record as one JSON document."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CommitRecord":
        """Parse a record written by :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        return cls(**data)

    @classmethod
    def parse(cls, text: str, where: str) -> "CommitRecord":
        """Parse the record read from ``where``; :class:`SinkError` with the fix when it is unreadable."""
        try:
            return cls.from_json(text)
        except (ValueError, TypeError) as exc:
            raise SinkError(
                f"commit-log record {where} is unreadable: {exc}",
                "restore it from backup, or remove it and the partition it names, then rerun",
            ) from None


class CommitLog:
    """The commit-log records of one output path."""

    def __init__(self, fs: OutputFilesystem) -> None:
        self.fs = fs
        self.dir = fs.path(layout.COMMITS)

    def records(self) -> list[CommitRecord]:
        """Every record, in LSN order."""
        out: list[CommitRecord] = []
        for name, is_dir, _size in self.fs.list(self.dir):
            if is_dir or not name.endswith(".json") or name.startswith("_"):
                continue
            where = f"{self.dir}/{name}"
            out.append(CommitRecord.parse(self.fs.read_text(where), where))
        return sorted(out, key=lambda r: r.end_lsn)

    def high_water_mark(self) -> Optional[Lsn]:
        """The largest ``end`` of any record (None for a new output)."""
        records = self.records()
        return records[-1].end_lsn if records else None

    def has(self, end: int) -> bool:
        """True when a record for the batch ending at ``end`` exists."""
        return self.fs.exists(f"{self.dir}/{layout.commit_record_name(end)}")

    def append(self, record: CommitRecord) -> None:
        """Write a record (atomically where the filesystem renames atomically)."""
        self.fs.write_text(f"{self.dir}/{layout.commit_record_name(record.end_lsn)}", record.to_json())
