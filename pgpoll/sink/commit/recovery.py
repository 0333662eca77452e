"""Moving a committed batch into place, and fenced recovery after a crash or beside a live run.

A batch's data becomes visible to plain readers only after its run has won
the commit log's compare-and-set: the record names the staged files, then
they are moved into ``changes/lsn_range=<start>-<end>/`` (and each typed
table's into ``tables/<dir>/lsn_range=<start>-<end>/``). The move is
idempotent per file — source gone and target present is done — so the
publishing run and any other run's recovery may both work on it.

Recovery runs at every start and before every plan. It only ever acts on
what the commit log decides, never on timing:

1. For every record newer than the newest checkpoint whose staged files are
   still there, it finishes the move (the publisher died after winning).
2. Staging that no such record names and whose plan was made on a record
   older than the head is deleted: its run can never win (record
   planned_on+1 exists and is not its own). Staging planned on the head is
   never touched, however old — it may be a live run's; if that run is dead,
   the next batch that wins makes it deletable. A staging directory without
   a plan file is from an older pgpoll (or its plan was removed last, after
   it), so it is deleted.
   On an object store (``fs.direct_writes``) a plan's files were uploaded to
   their final keys (:mod:`pgpoll.sink.stores.uploads`): a stale plan's upload
   manifest names them, and they are deleted with it; a record's own files
   stay, only its plan and manifest go.
3. At start only (``full``), and never on an object store (where version 2
   is the only version that ever wrote, and uploads are accounted for by
   their manifests): partitions under ``changes/`` and ``tables/<dir>/``
   that no record names. Version 2 moves files only after its record exists,
   so such a partition comes from a version-1 pgpoll that crashed between
   its rename and its record, or from a hand edit. Recovery adopts nothing
   outside the compare-and-set. A partition whose range ends above the
   high-water mark is deleted: the slot was never advanced past it, so the
   next batches write those changes again, and leaving it would show them
   twice. So is one at or below the retention floor (:mod:`pgpoll.sink.commit.floor`):
   ``pgpoll retain`` removes such partitions on purpose, before their
   records, and a pass that raced it (or followed a run it killed) finishes
   the job. Any other one at or below the high-water mark cannot come from a crash; its
   changes may be recorded nowhere else, so it is not deleted but set aside
   under ``_pgpoll/unrecorded/`` (out of plain readers' sight, kept for the
   operator) and reported. The partitions are listed *before* the commit log
   is read: a live run's partition is moved only after its record exists, so
   it is always found recorded. A partition ``pgpoll compact`` merged, and
   the ones a merge replaced until they are deleted, are named by the newest
   compaction record (unless the merge lies wholly at or below the retention
   floor: then it is retain's to remove, and what is left of it is deleted) (:mod:`pgpoll.sink.commit.compactions`); one it is
   writing is named by its upload manifest, written before the files and
   deleted only after the record exists: the manifests are read after the
   listing, then the map, so a merged partition listed is always found named.

**Step 3 runs only while it can find something.** It lists one directory
per batch under ``changes/`` and under each ``tables/<dir>/`` (through
Hadoop's ``FileSystem`` over py4j about 0.5 ms an entry: 10 s for 10,000 batches with one typed table), and since
version 2 never leaves an unrecorded partition, only two things can: a
version-1 pgpoll, and hand edits. So once a full pass has run, recovery says
so in the commit log's pointer (``clean``, :mod:`pgpoll.sink.commit.log`),
and later starts skip the pass when the pointer holds: it names a readable
checkpoint that folds no version-1 record and is marked clean. Every other
output gets the full pass at every start, exactly as before: outputs with
version-1 records, outputs whose log has no checkpoint yet (fewer than
``CHECKPOINT_EVERY`` batches: cheap), outputs whose pointer is absent or
wrong (when reading the log finds the pointer does not hold, the pass runs
after all, still listing the partitions before reading the log again). A
partition copied in by hand after that first pass is not looked for; to have
the next start look at everything again, remove ``_pgpoll/newest-checkpoint.json``.
The partitions above the high-water mark cannot be found without listing all
of them (names sort by LSN, but a listing returns every name), so skipping
the pass, not narrowing it, is what keeps start-up flat.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.compactions import load_map, planned_partitions
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.log import CHECKPOINT_EVERY, CommitLog, CommitRecord, LogState
from pgpoll.sink.stores.output_fs import OutputFs
from pgpoll.sink.stores.uploads import MANIFEST_SUFFIX, manifest_path, remove_uploads

log = logging.getLogger("pgpoll.sink")


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery found and did.

    ``head`` is the last commit-log record's number, ``high_water_mark`` its
    LSN; ``finished_moves`` the records whose staged files were moved into
    place; ``removed_staging`` / ``kept_staging`` staging ids deleted / left
    for a run planned on the head; ``removed_partitions`` unrecorded
    partitions above the high-water mark (deleted), ``unrecorded`` those at or
    below it (moved under ``_pgpoll/unrecorded/``); ``fenced`` whether the
    store publishes with an atomic compare-and-set. Nothing is ever adopted
    (``adopted`` stays empty; kept for the run summary's shape).
    """

    high_water_mark: Lsn | None
    head: int
    fenced: bool
    finished_moves: tuple[str, ...] = ()
    removed_staging: tuple[str, ...] = ()
    kept_staging: tuple[str, ...] = ()
    removed_partitions: tuple[str, ...] = ()
    unrecorded: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The report for the run summary."""
        return {
            "high_water_mark": str(self.high_water_mark) if self.high_water_mark is not None else None,
            "head": self.head,
            "fenced": self.fenced,
            "finished_moves": list(self.finished_moves),
            "removed_staging": list(self.removed_staging),
            "kept_staging": list(self.kept_staging),
            "removed_partitions": list(self.removed_partitions),
            "unrecorded": list(self.unrecorded),
            "adopted": [],
        }


def staging_id(name: str) -> str | None:
    """The staging id an entry of ``_pgpoll/staging/`` belongs to (None for temp files)."""
    if name.startswith("_"):
        return None
    if name.endswith(layout.PLAN_SUFFIX):
        return name[: -len(layout.PLAN_SUFFIX)]
    if name.endswith(MANIFEST_SUFFIX):
        return name[: -len(MANIFEST_SUFFIX)]
    if name.endswith(layout.TABLES_SUFFIX):
        return name[: -len(layout.TABLES_SUFFIX)]
    return name


def remove_staging(fs: OutputFs, sid: str, *, keep_uploads: bool = False) -> None:
    """Delete a staging id's directories and uploads, then its plan file (last: a directory without a plan is garbage).

    ``keep_uploads``: the files it uploaded are a committed record's (only the manifest goes).
    """
    if not fs.direct_writes:  # a staged batch (an object store's are uploads, never staged there)
        fs.delete(fs.path(layout.STAGING, sid))
        fs.delete(fs.path(layout.STAGING, sid + layout.TABLES_SUFFIX))
    elif keep_uploads:
        fs.delete(manifest_path(fs, sid))
    else:
        remove_uploads(fs, sid)
    fs.delete(fs.path(layout.STAGING, sid + layout.PLAN_SUFFIX))


def _move_dir(fs: OutputFs, src: str, dst: str, files: dict[str, int], what: str) -> bool:
    """Move ``files`` from ``src`` to ``dst``, idempotently; True when this call moved anything."""
    moved = False
    if fs.atomic_dir_rename and fs.exists(src) and not fs.exists(dst):
        try:
            fs.rename(src, dst)  # atomic here: readers see the whole partition or none of it
            moved = True
        except SinkError:
            pass  # another run moved it first, or a partial earlier move: finish file by file
    present = {n: size for n, is_dir, size in fs.list(dst) if not is_dir}
    for name, size in sorted(files.items()):
        if present.get(name) == size or (size < 0 and name in present):
            continue
        source, target = f"{src}/{name}", f"{dst}/{name}"
        if not fs.exists(source):
            if fs.exists(target):  # moved by another run meanwhile
                continue
            raise SinkError(
                f"{what} names {name}, which is neither staged nor in {dst}",
                "restore the file from backup; pgpoll cannot rewrite changes the slot no longer holds",
            )
        if name in present:
            fs.delete(target)  # a copy cut short on a store where rename is copy and delete
        try:
            fs.rename(source, target)
            moved = True
        except SinkError:
            if fs.exists(source) or not fs.exists(target):
                raise
    return moved


def finish_moves(fs: OutputFs, record: CommitRecord) -> bool:
    """Move a committed record's staged files into place and remove its staging; True when anything moved."""
    if record.staging is None:
        return False
    if record.in_place:  # uploaded to their final keys before the record was created: nothing to move
        remove_staging(fs, record.staging, keep_uploads=True)
        return False
    moved = False
    if record.partition:
        sizes = dict(record.file_sizes) or {f: -1 for f in record.files}
        for table, files in sorted(record.table_files.items()):
            moved |= _move_dir(
                fs, fs.path(layout.STAGING, record.staging + layout.TABLES_SUFFIX, table),
                fs.path(layout.TABLES, table, record.partition), dict(files), f"record {record.seq} ({table})",
            )
        moved |= _move_dir(
            fs, fs.path(layout.STAGING, record.staging), fs.path(layout.CHANGES, record.partition), sizes,
            f"record {record.seq}",
        )
    remove_staging(fs, record.staging)
    return moved


def _unrecorded_partitions(fs: OutputFs) -> list[tuple[str, str, Lsn]]:
    """``(kind, path under the root, end)`` of every partition directory under ``changes/`` and ``tables/*/``."""
    found: list[tuple[str, str, Lsn]] = []
    for name, is_dir, _size in fs.list(fs.path(layout.CHANGES)):
        bounds = layout.parse_partition_name(name) if is_dir else None
        if bounds is not None:
            found.append(("", f"{layout.CHANGES}/{name}", bounds[1]))
    for table, is_dir, _size in fs.list(fs.path(layout.TABLES)):
        for name, part_is_dir, _s in fs.list(fs.path(layout.TABLES, table)) if is_dir else ():
            bounds = layout.parse_partition_name(name) if part_is_dir else None
            if bounds is not None:
                found.append((table, f"{layout.TABLES}/{table}/{name}", bounds[1]))
    return found


def recover(fs: OutputFs, commit_log: CommitLog, *, full: bool = True, run: str | None = None) -> RecoveryReport:
    """Fenced recovery (see the module docstring); ``full`` adds the unrecorded-partition pass of start-up."""
    scan = full and not fs.direct_writes and commit_log.needs_scan()
    partitions = _unrecorded_partitions(fs) if scan else []  # listed before the log is read
    state = commit_log.state()
    if full and not scan and state.listed and not fs.direct_writes:  # the pointer did not hold: the full pass
        scan = True
        partitions = _unrecorded_partitions(fs)
        state = commit_log.state()
    entries = fs.list(fs.path(layout.STAGING))
    staged = {sid for name, _d, _s in entries if (sid := staging_id(name)) is not None}
    finished = [r.name or str(r.seq) for r in state.tail if r.staging in staged and finish_moves(fs, r)]
    named = {r.staging for r in state.tail if r.staging}
    removed: list[str] = []
    kept: list[str] = []
    for sid in sorted(staged - named):
        planned_on = _planned_on(fs, sid)
        if planned_on is not None and planned_on >= state.head:
            kept.append(sid)
        else:
            try:
                remove_staging(fs, sid)
            except SinkError as exc:  # its dead run's writer may still be adding files: the next recovery retries
                log.warning("stale staging %s not removed yet: %s", sid, exc.message)
                continue
            removed.append(sid)
    removed_parts, set_aside = _partitions(fs, commit_log, state, partitions) if scan else ([], [])
    # Every record up to the head has its files in place now. A checkpoint of an older pgpoll (which does not
    # say whether version-1 records precede it) is folded again at once, so the next start can take the pointer.
    cp = state.checkpoint
    older = full and state.listed and not state.v1_names and cp is not None and cp.v1_records is None
    if len(state.tail) >= CHECKPOINT_EVERY or (older and state.tail):
        commit_log.write_checkpoint(state, state.head, run)
    if scan or (full and fs.direct_writes):
        commit_log.mark_clean()
    if removed or removed_parts or set_aside or finished:
        log.info("recovery: %d move(s) finished, %d staging removed, %d partition(s) removed, %d set aside",
                 len(finished), len(removed), len(removed_parts), len(set_aside))
    return RecoveryReport(
        high_water_mark=state.high_water_mark, head=state.head, fenced=fs.fenced, finished_moves=tuple(finished),
        removed_staging=tuple(removed), kept_staging=tuple(kept), removed_partitions=tuple(removed_parts),
        unrecorded=tuple(set_aside),
    )


def _planned_on(fs: OutputFs, sid: str) -> int | None:
    """The head a staging id was planned on (None: no readable plan, so never a live run's)."""
    found = fs.read_tagged(fs.path(layout.STAGING, sid + layout.PLAN_SUFFIX))  # (None: removed by its own run)
    if found is None:
        return None
    try:
        return int(json.loads(found[0])["planned_on"])
    except (ValueError, KeyError, TypeError):
        return None  # a plan file is written whole (temp file, then rename): unreadable means damaged


def _partitions(fs: OutputFs, commit_log: CommitLog, state: LogState,
                found: list[tuple[str, str, Lsn]]) -> tuple[list[str], list[str]]:
    recorded_changes: set[str] = set()
    recorded_tables: set[tuple[str, str]] = set()
    planned = planned_partitions(fs)  # a compaction's files, written before its record: the manifests, then the map
    compacted = load_map(fs)  # merged partitions, and the merges they replaced (deleted after a grace period)
    floor = read_floor(fs)  # partitions at or below it are pgpoll retain's, removed on purpose (their records too)
    live = [m for m in compacted.merges if floor is None or m.last > floor.seq]  # the rest went with their records
    merged = [(m.partition, sorted(m.tables)) for m in live] + [(str(p), list(t)) for m in live for p, t in m.sources]
    for partition, tables in commit_log.partitions(state) + merged + planned:
        recorded_changes.add(partition)
        recorded_tables.update((t, partition) for t in tables)
    hwm = state.high_water_mark
    removed: list[str] = []
    set_aside: list[str] = []
    for table, rel, end in found:
        name = rel.rsplit("/", 1)[1]
        if (name in recorded_changes) if not table else ((table, name) in recorded_tables):
            continue
        if hwm is None or end > hwm or (floor is not None and end <= floor.end_lsn):
            fs.delete(fs.path(rel))
            removed.append(name if not table else rel)
        else:
            target = fs.path(layout.UNRECORDED, rel)
            if fs.exists(target):
                target = f"{target}.{uuid.uuid4().hex[:8]}"
            fs.rename(fs.path(rel), target)
            set_aside.append(rel)
            log.warning("%s is named by no commit-log record and lies at or below the high-water mark %s: "
                        "moved to %s/%s for inspection", rel, hwm, layout.UNRECORDED, rel)
    return removed, set_aside
