"""What ``pgpoll report`` shows, read from an output: its committed batches, gaps, runs and snapshots.

Only pgpoll's metadata is read (no data file, no Spark): from the commit log each batch's commit time,
rows, bytes, LSN range and the commit time of its newest change, and each gap ``pgpoll resync`` marked;
the run history (:mod:`pgpoll.observe.run_history`: how long each run took, how it ended; the commit log
knows batches, not runs); and each snapshot's plan and completion. The slot's state, with a DSN, is read
by the CLI through ``pgpoll status``'s code and handed over as its JSON.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pgpoll.errors import PgpollError
from pgpoll.lsn import Lsn
from pgpoll.observe.run_history import History, JobTotals, RunRecord, load_history
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import CommitRecord, parse_timestamp
from pgpoll.sink.snapshot_store import SnapshotStore, list_snapshots
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.observe")


@dataclass(frozen=True)
class Batch:
    """One committed batch as the report charts it (times in seconds since the epoch)."""

    seq: int
    committed_at: float
    rows: int
    bytes: int | None
    wal: int  # bytes of WAL between the batch's first and last commit LSN
    lag_s: float | None  # committed_at minus the commit time of the newest change it holds
    start: str
    end: str
    tables: int

    @classmethod
    def of(cls, record: CommitRecord) -> Batch:
        committed = parse_timestamp(record.committed_at).timestamp()
        newest = parse_timestamp(record.last_commit_ts).timestamp() if record.last_commit_ts else None
        try:
            wal = max(0, int(Lsn.parse(record.end)) - int(Lsn.parse(record.start)))
        except ValueError:
            wal = 0
        return cls(
            seq=record.seq, committed_at=committed, rows=record.rows,
            bytes=record.bytes if record.version >= 2 else None, wal=wal,
            lag_s=round(committed - newest, 3) if newest is not None else None,
            start=record.start, end=record.end, tables=len(record.tables),
        )


@dataclass(frozen=True)
class Gap:
    """A gap on record: the changes with a ``commit_lsn`` in ``(after, through]`` are missing from the output."""

    seq: int
    marked_at: str
    after: str
    through: str | None

    @classmethod
    def of(cls, record: CommitRecord) -> Gap:
        return cls(seq=record.seq, marked_at=record.committed_at, after=record.start, through=record.resume)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot: when, which tables, and whether (and where) it completed."""

    snapshot_id: str
    tables: list[str]
    complete: bool
    rows: int | None = None
    completed_at: str | None = None
    convergence_lsn: str | None = None


@dataclass
class ReportData:
    """Everything one report shows."""

    output: str
    generated_at: str
    batches: list[Batch] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    slots: list[dict[str, Any]] = field(default_factory=list)  # `pgpoll status --json`'s slots, with a DSN
    gaps: list[Gap] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)  # the run history's records, oldest first
    run_totals: dict[str, JobTotals] = field(default_factory=dict)  # per job, every run ever recorded
    runs_dropped: int = 0  # records the history no longer keeps (they count in the totals only)


def read_snapshots(fs: OutputFs) -> list[Snapshot]:
    """Every snapshot of the output, oldest first; a damaged plan is shown as a snapshot without tables."""
    found = []
    for sid in list_snapshots(fs):
        store = SnapshotStore(fs, sid)
        try:
            plan = store.plan()
            tables = [f"{e['schema']}.{e['table']}" for e in plan.get("tables", [])]
        except Exception:  # a report shows what it can read
            tables = []
        try:
            done = store.complete()
        except Exception:
            done = None
        found.append(Snapshot(
            sid, tables, done is not None, rows=(done or {}).get("rows"),
            completed_at=(done or {}).get("completed_at"), convergence_lsn=(done or {}).get("convergence_lsn"),
        ))
    return found


def read_output(fs: OutputFs, output: str, generated_at: str) -> ReportData:
    """The output's batches and gaps (every record of the commit log), run history and snapshots."""
    records = CommitLog(fs).records()
    try:
        history = load_history(fs)  # runs.json and the record files not folded into it yet
    except (PgpollError, ValueError, TypeError) as exc:  # a report shows what it can read
        log.warning("the run history of %s could not be read: %s", output, exc)
        history = History()
    return ReportData(
        output=output, generated_at=generated_at, batches=[Batch.of(r) for r in records if r.kind == "batch"],
        snapshots=read_snapshots(fs), gaps=[Gap.of(r) for r in records if r.is_gap], runs=history.records,
        run_totals=history.totals, runs_dropped=history.dropped,
    )
