"""The run history under ``OUTPUT/_pgpoll/``: one record per run of ingest, snapshot or materialize, failed ones too.

The commit log knows each batch, not each run: not how long a run took, the lag it saw, or that it failed. So
every run, at its end, writes one small record (:class:`RunRecord`) as its own file,
``_pgpoll/runs/<ended>-<job>-<run>.json``, created once under a name no other run uses: two runs ending at the
same moment, or a run racing an ingest on the same output, never write the same file, so nothing a run writes
can overwrite another's record (the commit log's lease and fence guard batches, not this).

Bounded however long the output lives: when ``FOLD_AT`` record files have gathered, the run that sees them
folds them into ``_pgpoll/runs.json`` (:class:`History`: the newest ``KEEP`` records, per-job totals of
everything ever folded, and how many records were dropped) with the store's compare-and-swap
(:meth:`OutputFs.swap`, or ``create_exclusive`` for the first fold), and only then deletes the files it
folded. Two runs folding at once: one swap wins, the other changes nothing. A run that dies between the swap
and the deletes leaves files whose records the history already holds (found by run id, not counted twice).
So no write pattern here can lose the whole history: the folded file is only ever replaced whole, atomically,
by a version that contains it.

:func:`fold` and :func:`merged` are pure; :func:`record_run`, :func:`load_history` are the I/O edges.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import PgpollError
from pgpoll.sink import layout
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.observe")

FOLD_AT = 20
"""Record files that make the next run fold them (each run lists ``runs/`` and reads these: keep it small)."""
KEEP = 500
"""Records the folded history keeps (the newest); older ones only count in the totals."""

OK = "ok"
RECORD_NAME = re.compile(r"^\d{8}T\d{12}Z-[a-z]+-[^/]+\.json$")


@dataclass(frozen=True)
class RunRecord:
    """One run: what it was, when, how it ended, and what it did.

    ``status`` is the summary's (``ok``, ``interrupted``, ``error``, ``busy``), ``exit_code`` the CLI's
    exit code for it; ``error`` the error's class name (never its text: no message can leak a secret here).
    ``lag_bytes`` is the slot's lag the run saw at its end (ingest only).
    """

    run_id: str
    job: str
    started_at: str
    ended_at: str
    seconds: float
    status: str
    exit_code: int
    slot: str | None = None
    batches: int = 0
    changes: int = 0
    bytes: int = 0
    lag_bytes: int | None = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.status == OK

    @property
    def ended(self) -> datetime:
        return datetime.fromisoformat(self.ended_at)

    def file_name(self) -> str:
        """Sorts by end time; unique by run id."""
        stamp = self.ended.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        return f"{stamp}-{self.job}-{self.run_id}.json"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """A record as written by this or a later version (unknown keys ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class JobTotals:
    """Everything one job ever did on this output, folded records and unfolded alike."""

    runs: int = 0
    failures: int = 0
    interrupted: int = 0
    batches: int = 0
    changes: int = 0
    bytes: int = 0

    def add(self, record: RunRecord) -> None:
        self.runs += 1
        if record.status == "interrupted":
            self.interrupted += 1
        elif not record.succeeded:
            self.failures += 1
        self.batches += record.batches
        self.changes += record.changes
        self.bytes += record.bytes


@dataclass
class History:
    """The folded history (``runs.json``), or the folded history merged with the unfolded records."""

    records: list[RunRecord] = field(default_factory=list)
    totals: dict[str, JobTotals] = field(default_factory=dict)
    dropped: int = 0

    def to_json(self) -> str:
        return json.dumps({"version": 1, "dropped": self.dropped,
                           "totals": {job: asdict(t) for job, t in sorted(self.totals.items())},
                           "records": [asdict(r) for r in self.records]}, sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> History:
        data = json.loads(text)
        return cls(records=[RunRecord.from_json(r) for r in data.get("records", [])],
                   totals={job: JobTotals(**t) for job, t in data.get("totals", {}).items()},
                   dropped=int(data.get("dropped", 0)))

    def last(self, job: str, *, succeeded: bool | None = None) -> RunRecord | None:
        """The newest record of ``job`` (only successes, or only failures, when ``succeeded`` says so)."""
        for record in reversed(self.records):
            if record.job == job and (succeeded is None or record.succeeded == succeeded):
                return record
        return None


def fold(history: History, new: list[RunRecord], keep: int = KEEP) -> History:
    """``history`` with the records of ``new`` it does not hold yet (by run id): sorted, the newest ``keep`` kept."""
    known = {r.run_id for r in history.records}
    totals = {job: JobTotals(**asdict(t)) for job, t in history.totals.items()}
    added = []
    for record in new:
        if record.run_id in known:
            continue
        known.add(record.run_id)
        added.append(record)
        totals.setdefault(record.job, JobTotals()).add(record)
    records = sorted(history.records + added, key=lambda r: (r.ended_at, r.run_id))
    overflow = max(0, len(records) - keep)
    return History(records=records[overflow:], totals=totals, dropped=history.dropped + overflow)


def merged(history: History, unfolded: list[RunRecord]) -> History:
    """The whole history as readers see it: the folded one and the records not folded yet, nothing dropped."""
    return fold(history, unfolded, keep=len(history.records) + len(unfolded))


def _read_folded(fs: OutputFs) -> tuple[History, str | None]:
    found = fs.read_tagged(fs.path(layout.RUNS_FOLDED))
    if found is None:
        return History(), None
    text, tag = found
    return History.parse(text), tag


def _read_unfolded(fs: OutputFs) -> dict[str, RunRecord]:
    """The record files not folded yet, by file name (a file that vanished under a concurrent fold is skipped)."""
    found: dict[str, RunRecord] = {}
    for name, is_dir, _size in sorted(fs.list(fs.path(layout.RUNS))):
        if is_dir or not RECORD_NAME.match(name):  # not a store's temporary file of a record being created
            continue
        try:
            found[name] = RunRecord.from_json(json.loads(fs.read_text(fs.path(layout.RUNS, name))))
        except (PgpollError, ValueError, TypeError) as exc:  # folded and deleted meanwhile, or not ours
            log.debug("run record %s skipped: %s", name, exc)
    return found


def load_history(fs: OutputFs) -> History:
    """The output's whole run history: the folded file and the records not folded yet."""
    history, _tag = _read_folded(fs)
    return merged(history, list(_read_unfolded(fs).values()))


def _fold_files(fs: OutputFs, files: dict[str, RunRecord], history: History, tag: str | None) -> None:
    """Fold ``files`` into the history with one compare-and-swap, then delete them (only if the swap won)."""
    text = fold(history, list(files.values()), keep=KEEP).to_json()
    path = fs.path(layout.RUNS_FOLDED)
    won = fs.create_exclusive(path, text) if tag is None else fs.swap(path, text, tag)
    if not won:  # another run folded first: its history holds these records or will on the next fold
        return
    for name in files:
        fs.delete(fs.path(layout.RUNS, name))


def record_run(fs: OutputFs, record: RunRecord) -> History:
    """Write ``record`` as its own file, fold when enough files gathered; returns the whole history with it."""
    fs.mkdirs(fs.path(layout.RUNS))
    fs.create_exclusive(fs.path(layout.RUNS, record.file_name()), record.to_json())
    history, tag = _read_folded(fs)
    files = _read_unfolded(fs)
    files.setdefault(record.file_name(), record)  # a store that lists late still counts this run
    if len(files) >= FOLD_AT:
        try:
            _fold_files(fs, files, history, tag)
        except PgpollError as exc:  # the records stay as files: the next run folds them
            log.warning("could not fold the run history: %s", exc.message)
    return merged(history, list(files.values()))
