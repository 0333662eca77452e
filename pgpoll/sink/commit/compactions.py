"""Compaction records: which runs of committed batches ``pgpoll compact`` merged, and where their rows are now.

Under ``PATH/_pgpoll/``::

    compactions/seq-<16 digits>.json          compaction record K (1, 2, 3, ...)
    compactions-staging/<id>.plan.json         a compaction being written, planned on record K-1
    compactions-staging/<id>.files.json        every file it writes, listed before it is written (the manifest)

A merge's files are written at their final place before its record exists
(on every store: nothing is moved after the record, so a reader resolving a
merge always finds them); the manifest names them until the record does, so
recovery's full pass takes them for a planned compaction's, never a loser's
(:func:`planned_partitions`), and a dead compaction's are deleted by the next.

**Why a log of its own.** Compaction rewrites what batches already
committed; it never decides what is committed. Its records are numbered and
fenced like the commit log's (record K is created only if it does not exist:
:meth:`OutputFs.create_exclusive`), but they do not take the commit log's
numbers, so an ``ingest`` publishing beside a compaction never loses its
batch to it, and the commit log's records, high-water mark, checkpoints and
chains (``prev_rows``, ``prev_tables``) mean exactly what they meant before.

**Each record holds the whole map.** Record K lists every live *merge*: a
contiguous range of commit-log records ``[first, last]`` whose change-log
files (and typed tables' files) were rewritten into one partition
``changes/lsn_range=<start>-<end>/`` (``tables/<dir>/lsn_range=.../``) named by
the range's first and last change. Merges never overlap; a later merge that
takes in an earlier one replaces it in the map. So a reader reads one record,
the newest, and resolves each commit-log record through the merge covering it
(:meth:`CompactionMap.resolve`): the records' own file lists stay what they
were when written (true of the batch), and the map says where those rows live
now. The records a merge replaced keep their files until a later ``compact``
run deletes them (``sources``; the grace period lets a reader that listed
them first finish), and their names stay in the commit log for good.

The map is read by :mod:`pgpoll.reader` (through the change table's Delta log,
which gets one version per compaction record: removes and adds with
``dataChange`` false, application transaction :data:`APP_ID`), the Spark
reader, ``materialize`` and recovery's full pass (a merged partition is named
by a record, never taken for a loser's). A reader reads the map *before* the
commit log's state: a merge only covers records committed before it, so no
merge it sees holds a record newer than the state it reads next.

**With a retention floor** (:mod:`pgpoll.sink.commit.floor`): a merge lies
wholly above it or wholly at or below it (``pgpoll retain`` lowers its floor
rather than cut one, and removes a merge below it whole). The newest record
may still list merges below the floor until the next compaction record
leaves them out; nothing resolves them (readers and ``materialize`` resolve
only the records above the floor, recovery's full pass does not count them
as named, compaction merges nothing at or below the floor).

Records are never pruned: finding the newest lists ``compactions/``, one
entry per compaction run that merged anything (a daily run: 365 a year).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.sink import layout
from pgpoll.sink.commit.records import CommitRecord, record_name, utc_now
from pgpoll.sink.stores.output_fs import OutputFs

FORMAT = 1
"""The format of compaction records this pgpoll writes and reads."""
APP_ID = "pgpoll:compact"
"""The Delta application transaction of compaction versions of ``changes/``: its version is the newest
compaction record applied to the Delta log."""
_NAME = re.compile(r"^seq-([0-9]{16})\.json$")


@dataclass(frozen=True)
class Merge:
    """Commit-log records ``first``..``last`` rewritten into ``partition`` (see the module docstring).

    ``files``: the change log's merged files and their sizes; ``tables``: each
    typed table's; ``rows`` the change log's rows; ``by`` the compaction record
    that made it and ``made_at`` when; ``staging`` where its files were written
    before that record existed (``compactions-staging/<id>``), ``in_place``
    whether they were uploaded to their final keys instead (object stores);
    ``sources`` ``[partition, [typed table dirs]]`` of what it replaced and
    whose files a later run deletes (an earlier merge's own sources are carried
    over until they are deleted).
    """

    first: int
    last: int
    partition: str
    files: dict[str, int]
    tables: dict[str, dict[str, int]]
    rows: int
    by: int
    made_at: str
    staging: str | None = None
    in_place: bool = False
    sources: list[list[Any]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """The merged change-log files' size."""
        return sum(self.files.values())


@dataclass(frozen=True)
class CompactionRecord:
    """Compaction record ``seq``: the whole map after it (``merges``, ordered by ``first``), which of them it made
    (``made``: partitions), the change-log files those replaced in the Delta log (``removed``: partition to
    ``{file: size}``, this record's only), and the compaction record it was planned on."""

    seq: int
    merges: list[Merge]
    made: list[str]
    removed: dict[str, dict[str, int]]
    planned_on: int
    run: str
    committed_at: str = field(default_factory=utc_now)
    version: int = FORMAT
    kind: str = "compaction"

    def to_json(self) -> str:
        """The record as one JSON document."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str, where: str) -> CompactionRecord:
        """Parse a record; :class:`SinkError` with the fix when it is unreadable or newer than this pgpoll reads."""
        try:
            data = json.loads(text)
            if int(data.get("version", 0)) > FORMAT:
                raise SinkError(f"compaction record {where} has format {data['version']}, newer than this pgpoll "
                                f"reads ({FORMAT})", "upgrade pgpoll to the version that compacted the output")
            merges = [Merge(**m) for m in data.pop("merges")]
            return cls(merges=merges, **data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SinkError(f"compaction record {where} is unreadable: {exc}",
                            "restore it from backup: the merged files it names hold rows whose batches are gone") from None

    def made_merges(self) -> list[Merge]:
        """The merges this record made."""
        return [m for m in self.merges if m.by == self.seq]


@dataclass(frozen=True)
class Piece:
    """What a reader reads for a run of commit-log records: a batch's own files, or a merge's (``merge`` set)."""

    partition: str
    files: dict[str, int]
    merge: Merge | None = None
    staging: str | None = None
    """Where a batch's files were written before its record existed (``_pgpoll/staging/<id>``): a reader looks
    there when they are not in place yet (a merge's are written in place)."""


class CompactionMap:
    """The newest compaction record's merges, looked up by commit-log record number (empty: never compacted)."""

    def __init__(self, record: CompactionRecord | None) -> None:
        self.record = record
        self.merges = list(record.merges) if record is not None else []
        self._firsts = [m.first for m in self.merges]

    def __bool__(self) -> bool:
        return bool(self.merges)

    def covering(self, seq: int) -> Merge | None:
        """The merge holding record ``seq``'s rows now (None: its own files)."""
        i = bisect.bisect_right(self._firsts, seq) - 1
        if i >= 0 and self.merges[i].first <= seq <= self.merges[i].last:
            return self.merges[i]
        return None

    def resolve(self, records: Sequence[CommitRecord], table: str | None = None) -> list[Piece]:
        """Where the rows of ``records`` (in order) are: the change log's (``table`` None) or typed table ``table``'s.

        A merge appears once, where its first record given appears; it can
        hold rows of records not given (read its rows after a position by
        ``commit_lsn``: :meth:`covers_more`).
        """
        out: list[Piece] = []
        seen: set[str] = set()
        for r in records:
            if not r.partition or (table is not None and table not in r.tables):
                continue
            merge = self.covering(r.seq)
            if merge is None:
                files = (dict(r.file_sizes) or {n: -1 for n in r.files}) if table is None else dict(r.table_files.get(table, {}))
                staged = f"{layout.STAGING}/{r.staging}" if r.staging else None
                if staged is not None and table is not None:
                    staged = f"{layout.STAGING}/{r.staging}{layout.TABLES_SUFFIX}/{table}"
                out.append(Piece(r.partition, files, None, staged if not r.in_place else None))
            elif merge.partition not in seen:
                seen.add(merge.partition)
                files = merge.files if table is None else merge.tables.get(table, {})
                out.append(Piece(merge.partition, dict(files), merge))  # written in place before its record
        return out

    def covers_more(self, records: Sequence[CommitRecord]) -> bool:
        """Whether a merge covering one of ``records`` also covers a record not among them."""
        given = {r.seq for r in records}
        for r in records:
            merge = self.covering(r.seq)
            if merge is not None and any(s not in given for s in range(merge.first, merge.last + 1)):
                return True
        return False


class CompactionLog:
    """The compaction records of one output: the newest one, and the fenced append (see the module docstring)."""

    def __init__(self, fs: OutputFs) -> None:
        self.fs = fs
        self.dir = fs.path(layout.COMPACTIONS)

    def path(self, seq: int) -> str:
        """Where record ``seq`` lives."""
        return f"{self.dir}/{record_name(seq)}"

    def head(self) -> int:
        """The newest record's number (0: never compacted): one listing of a directory with a file per compaction run."""
        seqs = [int(m.group(1)) for n, d, _s in self.fs.list(self.dir) if not d and (m := _NAME.match(n))]
        return max(seqs, default=0)

    def read(self, seq: int) -> CompactionRecord:
        """Record ``seq``."""
        where = self.path(seq)
        return CompactionRecord.parse(self.fs.read_text(where), where)

    def newest(self) -> CompactionRecord | None:
        """The newest record (None: never compacted)."""
        head = self.head()
        return self.read(head) if head else None

    def create(self, record: CompactionRecord) -> bool:
        """The compare-and-set: record ``record.seq`` only if it does not exist; True when this call created it."""
        self.fs.mkdirs(self.dir)
        return self.fs.create_exclusive(self.path(record.seq), record.to_json())


def load_map(fs: OutputFs) -> CompactionMap:
    """The output's compaction map now (empty for an output never compacted: one listing)."""
    return CompactionMap(CompactionLog(fs).newest())


def typed_files(fs: OutputFs, table: str, records: Sequence[CommitRecord], compacted: CompactionMap) -> list[tuple[str, int]]:
    """The typed files of table directory ``table`` holding ``records``' rows, with their sizes: each record's own, or
    the merge now holding them (which can hold other records' rows too: :meth:`CompactionMap.covers_more`).

    From the records (exact on every store: a partition on an object store
    can also hold a losing run's upload until recovery deletes it); records
    of older versions name no files, so their partition is listed.
    """
    out: list[tuple[str, int]] = []
    for piece in compacted.resolve(records, table):
        directory = fs.path(layout.TABLES, table, piece.partition)
        if piece.files:
            out += [(f"{directory}/{f}", int(size)) for f, size in sorted(piece.files.items())]
        else:
            out += [(f"{directory}/{n}", size) for n, is_dir, size in fs.list(directory)
                    if not is_dir and n.startswith("part-")]
    return out


def planned_partitions(fs: OutputFs) -> list[tuple[str, list[str]]]:
    """``(partition, typed tables)`` of every file a compaction's upload manifest names (written, no record yet)."""
    found: dict[str, set[str]] = {}
    for name, is_dir, _size in fs.list(fs.path(layout.COMPACTION_STAGING)):
        if is_dir or not name.endswith(".files.json"):
            continue
        text = fs.read_tagged(fs.path(layout.COMPACTION_STAGING, name))
        for path in json.loads(text[0]) if text is not None else []:
            parts = str(path).rstrip("/").split("/")
            if len(parts) >= 3 and parts[-3] == layout.CHANGES:  # (a typed table's directory always has a dot)
                found.setdefault(parts[-2], set())
            elif len(parts) >= 4 and parts[-4] == layout.TABLES:
                found.setdefault(parts[-2], set()).add(parts[-3])
    return [(p, sorted(t)) for p, t in sorted(found.items())]
