"""Commit-log records: one file per committed batch, its name and its JSON (format versions 1 and 2).

Under ``PATH/_pgpoll/``::

    commits/<16 hex end>.json        version 1: one record per batch, named by its end LSN
    commits/seq-<16 digits>.json     version 2: record number <seq> (1, 2, 3, ...)

**Version 2 is a fenced log.** Records are numbered; each names its
predecessor (``prev``: the previous ``seq``, or for the first version-2
record after version-1 records that record's file name). Publishing batch
N+1 is a compare-and-set: record N+1 is created only if it does not exist
(:meth:`OutputFs.create_exclusive`), so of two runs that planned on record N
exactly one wins. Version-1 records (written by older pgpoll) are read and
numbered 1..K in LSN order; new records continue at K+1. The zero-padded
names sort in order, so the head (the last ``seq``) comes from listing names,
without reading a record.

The log that reads and creates them is :class:`pgpoll.sink.commit.log.CommitLog`;
everything here is importable from :mod:`pgpoll.sink.commit.log` too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn

VERSION = 2
"""The format of the batch records this pgpoll writes."""

BATCH, GAP = "batch", "gap"
KINDS = (BATCH, GAP)
NEW_HISTORY = ("timeline_diverged", "other_server")
"""Gap reasons of a server whose history is not the output's (:mod:`pgpoll.source.slot_gap`'s positions)."""
GAP_VERSION = 3
"""Gap records (``kind`` "gap", written by ``pgpoll resync``) are format 3: a pgpoll that reads only up to 2
refuses the output rather than read an empty batch where changes are missing."""
READ_VERSION = GAP_VERSION
"""The newest record format this pgpoll reads."""


def record_name(seq: int) -> str:
    """The file name of version-2 record ``seq`` (also a checkpoint's, in its own directory)."""
    return f"seq-{seq:016d}.json"


def utc_now() -> str:
    """Now, as the log writes times: ISO 8601 in UTC."""
    return datetime.now(UTC).isoformat()


def parse_timestamp(text: str) -> datetime:
    """A time the log wrote (ISO 8601; UTC when it names no zone); :class:`SinkError` when it is not one."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SinkError(f"commit-log timestamp {text!r} is not ISO 8601", "check the commit-log records") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class CommitRecord:
    """One committed batch (version 1 or 2; ``version`` says which).

    ``start``/``end`` are the smallest and largest commit LSN the batch
    accounts for (``end`` is where the slot is advanced to); ``partition`` is
    the directory under ``changes/`` (None when the batch wrote no rows);
    ``files`` its data files, ``file_sizes`` their sizes and ``bytes`` the sum;
    ``tables`` the typed tables (``tables/<dir>/<partition>``), whose files are
    in ``table_files``; ``staging`` the staging id the files were published
    from; ``first_commit_ts``/``last_commit_ts`` the commit times of the oldest
    and newest change written (ISO 8601, UTC); ``xid_min``/``xid_max`` the
    batch's full 64-bit transaction ids (None when unknown); ``table_stats``
    per-table figures for later use; ``server`` the source server's
    ``system_identifier`` and ``timeline`` when the batch was read (None in
    records of older versions: :mod:`pgpoll.source.slot_gap` compares them);
    ``name`` is the file name (not stored).

    A gap record (``kind`` "gap", format 3) says the output lacks the changes
    committed in ``(start, resume]``: the slot had been moved to ``resume`` by
    something else. ``start`` is the output's position when the gap was
    marked (:func:`pgpoll.sink.commit.head.output_head`: the high-water mark,
    or an earlier gap's ``resume`` when nothing was ingested since), which is
    where the missing changes begin. Its ``end`` is the high-water mark it was
    written on (a gap never moves the mark past changes the output does not
    hold), so ``start`` and ``end`` differ only after a second gap; ingest
    goes on from ``resume``, and materialize builds no table across it
    without a snapshot planned after it. A gap of a new history (``reason``
    ``timeline_diverged`` or ``other_server``: an unsafe failover, another
    system) starts where the histories part instead: the records in
    ``(start, end]`` hold changes the server never had
    (:mod:`pgpoll.snapshot.resync_history`).
    """

    start: str
    end: str
    rows: int
    files: list[str]
    partition: str | None
    slot: str
    plugin: str
    committed_at: str = field(default_factory=utc_now)
    adopted: bool = False
    last_commit_ts: str | None = None
    tables: list[str] = field(default_factory=list)
    version: int = VERSION
    seq: int = 0
    prev: int | str | None = None
    kind: str = "batch"
    file_sizes: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    table_files: dict[str, dict[str, int]] = field(default_factory=dict)
    run: str | None = None
    staging: str | None = None
    first_commit_ts: str | None = None
    xid_min: int | None = None
    xid_max: int | None = None
    table_stats: dict[str, Any] | None = None
    publications: list[str] = field(default_factory=list)
    in_place: bool = False
    """The files were written at their final place before the record (object stores): nothing to move."""
    server: dict[str, Any] | None = None
    resume: str | None = None
    """Gap records: where the slot was when the gap was marked (the changes up to it are missing)."""
    reason: str | None = None
    """Gap records: why (:mod:`pgpoll.source.slot_gap`'s position): ``timeline_diverged`` and ``other_server`` mark a
    server whose history is not the output's (``start`` is then where they part: the switch point, or 0/0 for
    another system); None (older records) or ``slot_ahead_of_output``: a slot moved past the output."""
    prev_rows: int | None = None
    """The newest earlier record that wrote rows (0: none; None: written before 0.3, unknown)."""
    prev_tables: dict[str, int] | None = None
    """Each typed table of ``tables``: the newest earlier record naming it (0: none; None: before 0.3). With
    ``prev_rows`` a chain back through the history that skips heartbeats and other tables' batches, so that
    ``materialize`` and the change table read only the records they apply (:mod:`pgpoll.sink.commit.history`)."""
    name: str = field(default="", compare=False)

    @property
    def is_gap(self) -> bool:
        """A gap marker, not a batch."""
        return self.kind == GAP

    @property
    def new_history(self) -> bool:
        """A gap marked on a server whose history left the output's (a diverged timeline, another system)."""
        return self.is_gap and self.reason in NEW_HISTORY

    def covered_by(self, plan_lsn: int, plan_server: Any) -> bool:
        """Whether a snapshot planned at ``plan_lsn`` on ``plan_server`` (its plan's ``server``) holds what this gap
        lacks: planned at or after ``resume`` and, when both name a server, on this gap's system at its timeline or
        a later one. A snapshot of the old history can be planned past ``resume`` (positions are reused there), so
        a new-history gap takes no snapshot that names no server (every such snapshot predates it)."""
        resume = Lsn.parse(self.resume) if self.resume is not None else self.end_lsn
        if plan_lsn < int(resume):
            return False
        gap_server, server = self.server, plan_server if isinstance(plan_server, dict) else None
        if server is None or not isinstance(gap_server, dict):
            return not self.new_history
        return (server.get("system_identifier") == gap_server.get("system_identifier")
                and int(server.get("timeline", 0)) >= int(gap_server.get("timeline", 0)))

    @property
    def end_lsn(self) -> Lsn:
        """``end`` as an Lsn."""
        return Lsn.parse(self.end)

    def to_json(self) -> str:
        """The record as one JSON document (``name`` is the file's, not stored)."""
        data = asdict(self)
        del data["name"]
        if self.version >= 2:
            del data["adopted"]  # version 2 adopts nothing
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, name: str = "") -> CommitRecord:
        """Parse a record: version 2, or version 1 (``version`` 1, ``seq`` set by the caller)."""
        data: dict[str, Any] = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        version = int(data.get("version", 1))
        if version > READ_VERSION:
            raise SinkError(
                f"commit-log record {name} has format version {version}, newer than this pgpoll reads ({READ_VERSION})",
                "upgrade pgpoll to the version that wrote the output",
            )
        kind = data.get("kind", BATCH)
        if kind not in KINDS:
            raise SinkError(
                f"commit-log record {name} is of kind {kind!r}, which this pgpoll does not know",
                "upgrade pgpoll to the version that wrote the output",
            )
        known = {f.name for f in fields(cls)} - {"name"}
        kept = {k: v for k, v in data.items() if k in known}  # later minor additions are ignored
        kept["version"] = version
        return cls(**kept, name=name)

    @classmethod
    def parse(cls, text: str, where: str, name: str = "") -> CommitRecord:
        """Parse the record read from ``where``; :class:`SinkError` with the fix when it is unreadable."""
        try:
            return cls.from_json(text, name)
        except (ValueError, TypeError, KeyError) as exc:
            raise SinkError(
                f"commit-log record {where} is unreadable: {exc}",
                "restore it from backup, or remove it and the partition it names, then rerun",
            ) from None
