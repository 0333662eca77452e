"""Publishing batches into the output behind the commit log's fence.

The driver's order for every batch::

    plan = sink.plan()               # recovery, then staging/<id>.plan.json {planned_on: head N}
    ... Spark writes plan.staging (and typed tables under plan.tables_staging) ...
    record = sink.publish(plan, ...) # create record N+1 (the compare-and-set), then move the files
    ... advance the slot to record.end ...

``plan`` writes the plan file *before* Spark writes ``staging/<id>/``, so
recovery always knows which record a staged batch was planned on (see
:mod:`pgpoll.sink.commit.recovery`). ``publish`` creates record N+1 naming the
staged files and the target partition; if another run created it first this
run lost: only this plan's staging is removed and :class:`FenceLostError`
(exit 3) is raised — batches the run committed before stay committed, and
the slot must not be advanced. After winning, the staged files are moved
into ``changes/lsn_range=<start>-<end>/`` (and ``tables/<dir>/...``): plain
readers see a batch only once it is committed. Every batch's high-water mark
is the one of the record it was planned on (``plan.high_water_mark``): the
batch task must skip changes at or below it.

On an object store (``fs.direct_writes``) nothing is moved: the task
uploaded the files to their final keys, under an upload manifest, before the
record (:mod:`pgpoll.sink.stores.uploads`), and ``publish`` gets them from the
task's outcome; the record says ``in_place``. A loser deletes its uploads.

On a store without atomic create-if-absent (``fs.fenced`` is False) the same
steps run, best effort: the lease (:mod:`pgpoll.sink.commit.lease`) is then the only
guard, and the run summary says ``"fenced": false``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import FenceLostError, SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.change_table import ChangeTable
from pgpoll.sink.commit.log import CHECKPOINT_EVERY, VERSION, CommitLog, CommitRecord, LogState
from pgpoll.sink.commit.recovery import RecoveryReport, finish_moves, recover, remove_staging
from pgpoll.sink.stores.filesystem import OutputFs, check_writable, open_output
from pgpoll.sink.stores.uploads import UploadedBatch, remove_uploads

log = logging.getLogger("pgpoll.sink")


@dataclass(frozen=True)
class Plan:
    """One batch planned on commit-log record ``planned_on`` (it can only become record ``planned_on + 1``).

    Spark writes the envelope to ``staging`` and typed tables under
    ``tables_staging``; the batch must leave out changes at or below
    ``high_water_mark`` (the high-water mark as of record ``planned_on``).
    """

    id: str
    staging: str
    tables_staging: str
    planned_on: int
    prev: int | str | None
    high_water_mark: Lsn | None
    run: str
    created: str

    @property
    def seq(self) -> int:
        """The record number this batch competes for."""
        return self.planned_on + 1


class BatchSink:
    """The output path: planning, publishing and recovering batches behind the fence.

    ``spark`` selects Hadoop's filesystem (the ingest driver); ``None`` the
    local/pyarrow one (tests, tools without a JVM). ``fs`` overrides both.
    """

    def __init__(self, spark: Any, output: str, *, fs: OutputFs | None = None, run: str | None = None) -> None:
        self.fs: OutputFs = fs if fs is not None else open_output(output, spark)
        self.log = CommitLog(self.fs)
        self.changes = ChangeTable(self.fs)
        self.run = run or uuid.uuid4().hex
        self.last_recovery: RecoveryReport | None = None
        self._plans: dict[str, Plan] = {}
        if not self.fs.fenced:
            log.warning(
                "output %s (%s:) cannot create files atomically: the commit log is not fenced, and only the "
                "lease keeps two runs apart (docs/how-to/object-stores.md has the table of fenced stores)",
                self.fs.root, self.fs.scheme,
            )

    @property
    def fenced(self) -> bool:
        """True when publishing is an atomic compare-and-set on this store."""
        return self.fs.fenced

    def check_writable(self) -> None:
        """Fail early (SinkError) when the output cannot be written (:func:`pgpoll.sink.stores.filesystem.check_writable`)."""
        check_writable(self.fs)

    def recover(self, *, full: bool = True, slot: str | None = None, plugin: str | None = None) -> RecoveryReport:
        """Fenced recovery (:mod:`pgpoll.sink.commit.recovery`), then the change log's Delta table completed (a crash may
        have left a committed batch out of it); ``full`` at start (``slot``/``plugin`` are not needed)."""
        self.last_recovery = recover(self.fs, self.log, full=full, run=self.run)
        if self.log.last_state is not None:
            self.changes.sync(self.log, self.log.last_state)
        return self.last_recovery

    def plan(self) -> Plan:
        """Recover (light), then plan a batch on the current head: writes ``staging/<id>.plan.json``."""
        report = self.recover(full=False)
        sid = uuid.uuid4().hex
        created = datetime.now(UTC).isoformat()
        plan_file = self.fs.path(layout.STAGING, sid + layout.PLAN_SUFFIX)
        body = {"planned_on": report.head, "run": self.run, "created": created, "version": VERSION}
        self.fs.mkdirs(self.fs.path(layout.STAGING))
        if not self.fs.create_exclusive(plan_file, json.dumps(body, sort_keys=True)):
            raise SinkError(f"plan {plan_file} exists already", "rerun")  # pragma: no cover (a fresh uuid)
        state = self.log.last_state
        state_prev = state.prev_of(report.head + 1) if state is not None else None
        return Plan(
            id=sid, staging=self.fs.path(layout.STAGING, sid),
            tables_staging=self.fs.path(layout.STAGING, sid + layout.TABLES_SUFFIX), planned_on=report.head,
            prev=state_prev, high_water_mark=report.high_water_mark, run=self.run, created=created,
        )

    def ensure_current(self, plan: Plan) -> None:
        """FenceLostError when another run has published record ``plan.seq`` (this plan can no longer win).

        Call it when writing the staged batch fails: recovery of another run
        may have removed this plan's staging because it was already lost.
        """
        if self.log.head() > plan.planned_on:
            self.discard(plan)
            raise self._lost(plan)

    def discard(self, plan: Plan | str) -> None:
        """Remove a planned batch that will not be published (its staging and its plan file)."""
        if isinstance(plan, str):  # a staging path (the call of earlier versions)
            found = self._plans.pop(plan, None)
            sid = found.id if found is not None else plan.rstrip("/").rsplit("/", 1)[-1]
        else:
            self._plans.pop(plan.staging, None)
            sid = plan.id
        remove_staging(self.fs, sid)

    def clear_attempt(self, plan: Plan) -> None:
        """Remove what an earlier attempt of ``plan``'s batch wrote (staged files, or uploads); the plan stays."""
        if self.fs.direct_writes:
            remove_uploads(self.fs, plan.id)
        else:
            self.fs.delete(plan.staging)
            self.fs.delete(plan.tables_staging)

    def staging_path(self) -> str:
        """Plan a batch and return its staging path (the call of earlier versions: prefer :meth:`plan`)."""
        planned = self.plan()
        self._plans[planned.staging] = planned
        return planned.staging

    def _staged_files(self, directory: str) -> dict[str, int]:
        return {n: size for n, is_dir, size in self.fs.list(directory) if not is_dir and n.startswith("part-")}

    def _lost(self, plan: Plan) -> FenceLostError:
        return FenceLostError(
            f"another run published commit-log record {plan.seq} first; this run's batch planned on record "
            f"{plan.planned_on} was discarded and the slot not advanced",
            "only one ingest run per output at a time: let the other run finish (batches committed before stay "
            "committed)",
        )

    def publish(
        self, plan: Plan | str, *, start: int, end: int, rows: int, slot: str, plugin: str,
        last_commit_ts: str | None = None, first_commit_ts: str | None = None,
        tables: Mapping[str, Sequence[tuple[str, int]]] | None = None, xid_min: int | None = None,
        xid_max: int | None = None, table_stats: dict[str, Any] | None = None,
        publications: Iterable[str] = (), uploaded: UploadedBatch | None = None,
        server: dict[str, Any] | None = None,
    ) -> CommitRecord:
        """Commit the planned batch as record ``plan.seq`` (the compare-and-set), then move its files into place.

        ``uploaded``: on an object store, the files the task put at their
        final keys (nothing is moved then). Raises :class:`FenceLostError`
        (this plan's staging and uploads removed) when another run created
        that record first, :class:`SinkError` when the staged batch is
        incomplete or its partition exists already. ``server``: the source's
        system identifier and timeline, kept in the record for the gap check.
        """
        if isinstance(plan, str):
            found = self._plans.pop(plan, None)
            if found is None:
                raise SinkError(f"{plan} was not planned by this run", "plan batches with BatchSink.plan()")
            plan = found
        if plan.high_water_mark is not None and end <= int(plan.high_water_mark):
            raise SinkError(f"batch ending at {Lsn(end)} is not above the high-water mark {plan.high_water_mark}",
                            "discard batches that bring nothing new")
        partition = layout.partition_name(start, end) if rows > 0 else None
        direct = self.fs.direct_writes
        if direct and rows > 0 and (uploaded is None or uploaded.partition != partition):
            raise SinkError(f"batch {plan.id} was not uploaded to {partition}", "rerun")  # pragma: no cover (a bug)
        if direct:
            files = dict(uploaded.files) if uploaded is not None and rows > 0 else {}
            tables = {t: sorted(f.items()) for t, f in uploaded.tables.items()} if uploaded is not None else {}
        else:
            files = self._staged_files(plan.staging) if rows > 0 else {}
        if rows > 0 and not files:
            self.ensure_current(plan)
            raise SinkError(f"the staged batch {plan.staging} has no data files", "check the Spark executor logs")
        if partition is not None and not direct and self.fs.exists(self.fs.path(layout.CHANGES, partition)):
            self.ensure_current(plan)  # a run planned on the same head with the same range won, and moved in
            raise SinkError(f"partition {partition} already exists but no commit-log record names it",
                            "rerun: recovery at start removes it or sets it aside")
        table_files = {name: dict(listed) for name, listed in (tables or {}).items()} if partition else {}
        before = self.log.state()  # the records before plan.seq, unless another run won it (then create says so)
        index = before.table_index()
        record = CommitRecord(
            start=str(Lsn(start)), end=str(Lsn(end)), rows=rows, files=sorted(files), partition=partition, slot=slot,
            plugin=plugin, last_commit_ts=last_commit_ts, tables=sorted(table_files), version=VERSION, seq=plan.seq,
            prev=plan.prev, file_sizes=files, bytes=sum(files.values()),
            table_files=table_files, run=plan.run, staging=plan.id, first_commit_ts=first_commit_ts, xid_min=xid_min,
            xid_max=xid_max, table_stats=table_stats, publications=sorted(publications), in_place=direct,
            server=server,
            prev_rows=before.newest_data(), prev_tables={t: index[t][0] if t in index else 0 for t in table_files},
        )
        if not self.log.create(record):
            self.discard(plan)
            raise self._lost(plan)
        self._plans.pop(plan.staging, None)
        finish_moves(self.fs, record)
        state = self.log.state()
        self.changes.sync(self.log, state)  # the batch's Delta version (and any a crash left out before it)
        self._maybe_checkpoint(record.seq, state)
        return record

    def _maybe_checkpoint(self, seq: int, state: LogState) -> None:
        """Fold records 1..``seq`` once enough follow the newest checkpoint.

        Records up to the plan's head had their files moved by the recovery
        that preceded the plan, and record ``seq`` is this run's, just moved.
        """
        since = seq - (state.checkpoint.seq if state.checkpoint else 0)
        if since >= CHECKPOINT_EVERY:
            self.log.write_checkpoint(state, seq, self.run)
