"""``pgpoll compact``: merge runs of small committed batches into files of about a target size, fenced.

One run, in this order (each step is safe to die after; the next run
finishes or undoes it):

1. take the compaction lease (``_pgpoll/compact-lease.json``: one compaction
   per output at a time, exit 3 at once; ``ingest`` keeps its own lease and
   runs on) and ``pgpoll retain``'s (exit 3 while a retention runs:
   :mod:`pgpoll.housekeeping.leases`), read the retention floor, recover like any run (a dead publisher's moves finished), add
   committed batches the change table's Delta log lacks;
2. finish the newest compaction record (its manifests dropped, its Delta
   version and any earlier one a crash left out added, in order) and delete
   what a dead compaction wrote (the files its manifest lists; with the
   lease held every other compaction is dead, without it only those planned
   on an older record: :mod:`pgpoll.sink.commit.compactions`);
3. delete the partitions earlier merges replaced, once the Delta log has
   the merge, its files are all there and ``grace`` seconds have passed (a
   reader that listed them first still finds them meanwhile);
4. plan groups (:mod:`pgpoll.housekeeping.compact_plan`), write each merged
   file at its final place (``changes/lsn_range=<first>-<last>/``,
   ``tables/<dir>/lsn_range=.../``), every key listed first in the upload
   manifest ``_pgpoll/compactions-staging/<id>.files.json``: nothing is moved
   after the record, so a reader that resolves a merge always finds its
   files, and recovery's full pass takes a partition a manifest names for a
   planned compaction's, never for a loser's;
5. create compaction record K+1 only if it does not exist — the fence: of
   two compactions planned on record K one wins, the other deletes its files
   and exits 3 — then drop the manifest and add one Delta version (removes
   and adds, ``dataChange`` false); with ``grace`` 0, delete the sources at
   once.

**Over a retention floor** (:mod:`pgpoll.sink.commit.floor`): records at or
below it are gone, so nothing below it is merged, and merges wholly below it
(``pgpoll retain`` removed their files) leave the map at the next record;
the floor is read again just before record K+1 is created, and a run whose
merges it reached (a retention that took the lease over from a stalled run)
discards them and exits 3. Retention never cuts inside a merge (it keeps the
whole merge: :mod:`pgpoll.housekeeping.retention_plan`).

Nothing here takes a commit-log number: ``ingest`` publishing beside it
never loses a batch to it, and a merge covers only records older than the
newest (whose files may still be moving) and than ``min_age``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import ConfigError, FenceLostError
from pgpoll.faults import crash_if
from pgpoll.housekeeping.compact_files import delete_sources, unit_files, write_merged
from pgpoll.housekeeping.compact_plan import Group, eligible, groups, units
from pgpoll.housekeeping.leases import OtherLease, compaction_lease, retention_lease
from pgpoll.sink import layout
from pgpoll.sink.change_table import ChangeTable
from pgpoll.sink.commit.compactions import CompactionLog, CompactionRecord, Merge
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.recovery import recover
from pgpoll.sink.stores.filesystem import check_writable, open_output
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.housekeeping")

TARGET_SIZE = 128 << 20
MIN_AGE = 3600.0
GRACE = 600.0
_PLAN = ".plan.json"
_MANIFEST = ".files.json"


@dataclass(frozen=True)
class CompactOptions:
    """What ``pgpoll compact`` was asked: the output, the target file size, the minimum age of a batch (seconds)
    and how long replaced files stay for readers that listed them (seconds)."""

    output: str
    target_size: int = TARGET_SIZE
    min_age: float = MIN_AGE
    grace: float = GRACE


@dataclass
class CompactResult:
    """What one run did (its JSON is the command's summary)."""

    output: str
    compaction: int = 0
    merges: int = 0
    records: int = 0
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    deleted_partitions: int = 0
    finished: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The summary: files and bytes of the merged partitions before and after, records covered."""
        return {"output": self.output, "compaction": self.compaction, "merges": self.merges, "records": self.records,
                "files_before": self.files_before, "files_after": self.files_after,
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "deleted_partitions": self.deleted_partitions, "finished": self.finished,
                "seconds": round(self.seconds, 3)}


def _final(fs: OutputFs, partition: str, table: str | None = None) -> str:
    return fs.path(layout.CHANGES, partition) if table is None else fs.path(layout.TABLES, table, partition)


class Compaction:
    """One ``pgpoll compact`` run over one output (see the module docstring)."""

    def __init__(self, opts: CompactOptions, fs: OutputFs | None = None) -> None:
        self.opts = opts
        self.fs = fs or open_output(opts.output)
        self.log = CommitLog(self.fs)
        self.compactions = CompactionLog(self.fs)
        self.changes = ChangeTable(self.fs)
        self.run = uuid.uuid4().hex[:12]
        self.result = CompactResult(opts.output)
        self._swept: set[str] = set()
        self.floor = 0  # the retention floor: records up to it (and merges wholly below it) are gone

    def _refuse(self) -> None:
        if not self.changes.enabled:
            raise ConfigError(f"{self.opts.output}: compaction needs the change table's Delta log, which this store "
                              "cannot have", "compact outputs on a local path, file:, s3://, gs:// or az://")

    def compact(self) -> CompactResult:
        """The run; :class:`SlotBusyError` (exit 3) when another compaction holds the output or won record K+1."""
        started = time.monotonic()
        self._refuse()
        check_writable(self.fs)
        lease = compaction_lease(self.fs, self.run)
        lease.acquire()
        try:
            with OtherLease(retention_lease(self.fs, self.run)) as other:
                self._compact(lease, other)
        finally:
            lease.release()
        self.result.seconds = time.monotonic() - started
        return self.result

    def _compact(self, lease: Lease, other: OtherLease) -> None:
        """The run, both leases held."""
        found = read_floor(self.fs)
        self.floor = found.seq if found is not None else 0
        recover(self.fs, self.log, full=False, run=self.run)
        state = self.log.state()
        if state.v1_names:
            raise ConfigError(f"{self.opts.output} holds commit-log records of format 1 (named by LSN)",
                              "compaction reads format 2 records: ingest with this pgpoll for a while first")
        self.changes.sync(self.log, state)
        newest = self._finish(exclusive=lease.held)
        self._sweep(newest, self.opts.grace)
        planned_on = newest.seq if newest is not None else 0
        made = self._plan_and_write(newest, state.head, lease)
        if made is not None:
            record, sid, group_count = made
            crash_if("compact-after-write")
            lease.renew()  # still this run's (a stalled run whose lease another took over stops here)
            other.check()
            self._check_written(record)
            self._check_floor(record, sid)
            if not self.compactions.create(record):
                self._discard(sid)
                raise FenceLostError(f"another compaction created compaction record {record.seq} first; this "
                                     f"run's merges (planned on record {planned_on}) were discarded",
                                     "only one pgpoll compact per output at a time: let the other one finish")
            self.result.compaction = record.seq
            self.result.merges = group_count
            crash_if("compact-after-record")
            self._finish_record(record)
            if self.opts.grace <= 0:
                self._sweep(record, 0.0)

    def _check_floor(self, record: CompactionRecord, sid: str) -> None:
        """The retention floor has not reached this run's merges since it was read (records below it are gone: a
        merge of them would bring their rows back)."""
        found = read_floor(self.fs)
        made = record.made_merges()
        if found is not None and made and found.seq >= min(m.first for m in made):
            self._discard(sid)
            raise FenceLostError(f"pgpoll retain raised the retention floor to commit-log record {found.seq} while "
                                 f"this compaction merged records from {min(m.first for m in made)} on; its merges "
                                 "were discarded", "run pgpoll compact and pgpoll retain one after the other")

    # -- the newest record and what dead runs left --------------------------------------------------------------

    def _finish(self, exclusive: bool) -> CompactionRecord | None:
        """Finish the newest record (its manifests, Delta versions in order) and delete what dead runs wrote."""
        head = self.compactions.head()
        newest = self.compactions.read(head) if head else None
        if newest is not None:
            for seq in range(self.changes.compacted() + 1, head):  # Delta versions a crash left out, in order
                self.changes.apply_compaction(self.compactions.read(seq))
            self._finish_record(newest)
        named = {m.staging for m in newest.merges} if newest is not None else set()
        listed = {name.split(".", 1)[0] for name, _d, _s in self.fs.list(self.fs.path(layout.COMPACTION_STAGING))
                  if not name.startswith("_")}  # (temporary files of a write)
        for sid in sorted(listed - named):
            planned_on = self._planned_on(sid)
            if planned_on is not None and planned_on >= head and not exclusive:
                continue  # planned on the newest record, and no lease says its run is dead: it may be live
            self._discard(sid)
            self.result.finished.append(sid)
        return newest

    def _planned_on(self, sid: str) -> int | None:
        found = self.fs.read_tagged(self.fs.path(layout.COMPACTION_STAGING, sid + _PLAN))
        try:
            return int(json.loads(found[0])["planned_on"]) if found is not None else None
        except (ValueError, KeyError, TypeError):
            return None

    def _finish_record(self, record: CompactionRecord) -> None:
        """Drop ``record``'s upload manifests (its files are its own now) and add its Delta version (idempotent)."""
        for merge in record.made_merges():
            if merge.staging is not None:
                self._discard(merge.staging, keep_files=True)
        self.changes.apply_compaction(record)

    def _merged_files_present(self, merge: Merge) -> bool:
        """Whether every file of ``merge`` is there: its sources are deleted only then (a hand edit, a bug elsewhere,
        must never cost rows)."""
        for table, files in [(None, merge.files), *sorted(merge.tables.items())]:
            missing = [n for n in files if not self.fs.exists(f"{_final(self.fs, merge.partition, table)}/{n}")]
            if missing:
                log.error("compaction: %s lacks %s; the partitions it replaced are kept", merge.partition, missing)
                return False
        return True

    def _check_written(self, record: CompactionRecord) -> None:
        """Every merged file the record will name is where it was written (a run that took the lease over from a
        stalled one deletes its staging: then this run must not create a record naming files that are gone)."""
        for merge in record.made_merges():
            for table, files in [(None, merge.files), *sorted(merge.tables.items())]:
                directory = _final(self.fs, merge.partition, table)
                for name in files:
                    if not self.fs.exists(f"{directory}/{name}"):
                        raise FenceLostError(f"{directory}/{name} this run wrote is gone: another compaction took the "
                                             "output over", "only one pgpoll compact per output at a time: rerun later")

    def _discard(self, sid: str, keep_files: bool = False) -> None:
        """Delete a compaction's staging (and, unless ``keep_files``, the keys its manifest lists), plan last."""
        manifest = self.fs.path(layout.COMPACTION_STAGING, sid + _MANIFEST)
        found = self.fs.read_tagged(manifest)
        if found is not None and not keep_files:
            for path in json.loads(found[0]):
                self.fs.delete(path)
                directory = path.rsplit("/", 1)[0]
                if not self.fs.direct_writes and self.fs.exists(directory) and not self.fs.list(directory):
                    self.fs.delete(directory)  # the merged partition's directory, empty now (a local output)
        self.fs.delete(manifest)
        self.fs.delete(self.fs.path(layout.COMPACTION_STAGING, sid + _PLAN))

    def _sweep(self, newest: CompactionRecord | None, grace: float) -> None:
        """Delete the sources of merges the Delta log has and that are older than ``grace`` seconds."""
        if newest is None:
            return
        applied = self.changes.compacted()
        now = datetime.now(UTC)
        for merge in newest.merges:
            if merge.last <= self.floor:
                continue  # pgpoll retain removed it with what it replaced
            old = (now - datetime.fromisoformat(merge.made_at)).total_seconds() >= grace
            if merge.sources and merge.by <= applied and old and self._merged_files_present(merge):
                self.result.deleted_partitions += delete_sources(self.fs, merge.sources)
                self._swept.add(merge.partition)  # the next record lists them no more

    # -- planning and writing ---------------------------------------------------------------------------------

    def _plan_and_write(self, newest: CompactionRecord | None, head: int,
                        lease: Lease) -> tuple[CompactionRecord, str, int] | None:
        merges = [m for m in newest.merges if m.last > self.floor] if newest is not None else []  # (the rest is gone)
        small = [m for m in merges if m.bytes < self.opts.target_size]
        tail_merge = merges[-1] if merges and merges[-1] in small else None
        start = tail_merge.first if tail_merge is not None else (merges[-1].last + 1 if merges else 1)
        start = max(start, self.floor + 1)  # records at or below the retention floor are gone
        records = self.log.records_after(start - 1) if head > start else []
        records = eligible(records, head, datetime.now(UTC), self.opts.min_age)
        planned = groups(units(records, merges), self.opts.target_size)
        if not planned:
            return None
        sid = uuid.uuid4().hex
        seq = (newest.seq if newest is not None else 0) + 1
        self.fs.mkdirs(self.fs.path(layout.COMPACTION_STAGING))
        body = {"planned_on": seq - 1, "run": self.run, "created": datetime.now(UTC).isoformat()}
        self.fs.create_exclusive(self.fs.path(layout.COMPACTION_STAGING, sid + _PLAN), json.dumps(body))
        made: list[Merge] = []
        removed: dict[str, dict[str, int]] = {}  # what the Delta log drops: each unit's change-log files
        for group in planned:
            made.append(self._write_group(group, sid, seq))
            for unit in group.units:
                removed[unit.partition] = dict(unit.merge.files if unit.merge is not None else unit.record.file_sizes)  # type: ignore[union-attr]
            lease.renew()
        replaced = {u.partition for g in planned for u in g.units if u.merge is not None}
        kept = [replace(m, sources=[]) if m.partition in self._swept else m for m in merges if m.partition not in replaced]
        record = CompactionRecord(seq=seq, merges=sorted(kept + made, key=lambda m: m.first),
                                  made=[m.partition for m in made], removed=removed, planned_on=seq - 1, run=self.run)
        self.result.records = sum(g.last - g.first + 1 for g in planned)
        return record, sid, len(planned)

    def _write_group(self, group: Group, sid: str, seq: int) -> Merge:
        """Write one group's merged files at their final place, listed first in the upload manifest, and return its
        merge."""
        name = f"part-00000-{sid}-c000.snappy.parquet"
        targets = {table: f"{_final(self.fs, group.partition, table)}/{name}" for table in [None, *group.tables]}
        manifest = self.fs.path(layout.COMPACTION_STAGING, sid + _MANIFEST)  # the keys first: found if this run dies
        found = self.fs.read_tagged(manifest)
        listed = json.loads(found[0]) if found is not None else []
        self.fs.write_text(manifest, json.dumps(listed + list(targets.values())))
        files: dict[str, int] = {}
        tables: dict[str, dict[str, int]] = {}
        rows = 0
        for table, target in targets.items():
            inputs = [p for u in group.units for p in unit_files(self.fs, u, table)]
            written, size = write_merged(self.fs, inputs, target, table)
            if table is None:
                files, rows = {name: size}, written
            else:
                tables[table] = {name: size}
        self.result.files_before += sum(len(unit_files(self.fs, u, t)) for u in group.units for t in targets)
        self.result.files_after += len(targets)
        self.result.bytes_before += group.bytes
        self.result.bytes_after += sum(files.values())
        sources: list[list[Any]] = []
        for unit in group.units:
            sources.append([unit.partition, unit.tables])
            if unit.merge is not None and unit.merge.partition not in self._swept:
                sources += [list(s) for s in unit.merge.sources]  # not deleted yet: the new merge carries them
        return Merge(first=group.first, last=group.last, partition=group.partition, files=files, tables=tables,
                     rows=rows, by=seq, made_at=datetime.now(UTC).isoformat(), staging=sid, in_place=True,
                     sources=sources)


def compact(opts: CompactOptions) -> CompactResult:
    """Run ``pgpoll compact`` (see the module docstring)."""
    return Compaction(opts).compact()


