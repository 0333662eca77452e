"""Issue 17's proof: exactly once rests on the output's fenced commit log, not on a lock or on session state.

a. Rounds of three racing ``jobs/ingest.py`` processes (each with its own
   Spark) on one slot and one output, through a transaction pooler, one of
   them SIGKILLed, writers in between, then a clean run; both plugins.
b. A run whose control connection is terminated mid-batch while a second run
   starts.
c. Through PgBouncer (session and transaction mode), with the database's
   settings unlike pgpoll's pinned ones: the same output as a direct ingest.
d. Runs killed while writing a commit-log checkpoint (a checkpoint every 2
   records, set by a wrapper around ``jobs/ingest.py``), then a clean run.

The fast "busy" path (the lease) is off (``PGPOLL_TEST_NO_LOCK=1``) wherever
runs compete, so only the compare-and-set keeps them apart. What the racing
tests check in the end:

- every source change is in the output exactly once (distinct
  ``(commit_lsn, seq)`` equals the rows; the inserted ids are complete);
- the slot's ``confirmed_flush_lsn`` is the commit log's high-water mark;
- every partition under ``changes/`` is named by a commit-log record, also
  while the runs are racing (a plain reader never sees a losing run's batch).

``PGPOLL_TEST_FENCING_ROUNDS`` sets the rounds of (a) (default 2).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pgpoll.sink import layout
from pgpoll.sink.commit import batches, recovery
from pgpoll.sink.commit.log import Checkpoint, CommitLog, LogState, summarize
from pgpoll.sink.stores.filesystem import open_output
from tests.ingest.conftest import REPO, Capture, confirmed_lsn, ingest, make_capture, read_output

NO_LOCK = {"PGPOLL_TEST_NO_LOCK": "1"}
ROUNDS = int(os.environ.get("PGPOLL_TEST_FENCING_ROUNDS", "2"))  # rounds of racing runs per plugin (3 Sparks each)
BATCH_CHANGES = (300, 700, 1100)
ALLOWED_EXITS = {0, 3, -signal.SIGKILL}  # -9: the run this test killed


# --- processes -------------------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One ``jobs/ingest.py`` process in its own process group (so a kill takes its Spark JVM too)."""

    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            raise AssertionError(f"{self.args} did not finish within {timeout} s:\n{self.stderr()}") from None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def start_job(dsn: str, args: list[str], log: Path, *, env: dict[str, str] | None = None,
              script: Path = REPO / "jobs" / "ingest.py") -> Job:
    full_env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable, **NO_LOCK)
    full_env.update(env or {})
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(script), *args], env=full_env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    return Job(proc, log, args)


@contextlib.contextmanager
def reaped(jobs: list[Job]) -> Iterator[list[Job]]:
    """Kill whatever is still running when the block fails."""
    try:
        yield jobs
    finally:
        for job in jobs:
            if job.proc.poll() is None:
                job.kill()
                job.proc.wait()


# --- what the output holds -------------------------------------------------------------------------------------------


def partition_dirs(output: str) -> set[str]:
    changes = Path(output) / layout.CHANGES
    return {p.name for p in changes.iterdir() if p.is_dir() and p.name.startswith("lsn_range=")} if changes.exists() else set()


def recorded_partitions(output: str, log: CommitLog | None = None) -> set[str]:
    log = log or CommitLog(open_output(output))
    return {r.partition for r in log.records() if r.partition}


@dataclass
class Watcher:
    """Samples the output while runs race: a partition directory is only ever one a record names.

    The directories are listed before the records are read, and a batch's
    files are moved only after its record exists, so a directory seen is
    always found recorded.
    """

    output: str
    stray: set[str] = field(default_factory=set)
    samples: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watcher:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        log: CommitLog | None = None
        while not self._stop.wait(0.25):
            if not (Path(self.output) / layout.META).exists():
                continue
            try:
                log = log or CommitLog(open_output(self.output))  # records never change: each is read once
                dirs = partition_dirs(self.output)
                self.stray |= dirs - recorded_partitions(self.output, log)
                self.samples += 1
            except Exception as exc:  # a listing racing a rename: sample again
                self.errors.append(repr(exc))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def check(self) -> None:
        """No partition was ever seen without its record (and the watcher did look)."""
        assert self.samples > 0, f"the output was never sampled: {self.errors[-3:]}"
        assert not self.stray, f"partitions visible without a record: {sorted(self.stray)}"


def spark_partitions(spark: Any, output: str) -> set[str]:
    """The partition directory of every file a plain ``spark.read.parquet(PATH/changes)`` reads."""
    from pyspark.sql.functions import input_file_name

    if not partition_dirs(output):
        return set()
    files = spark.read.parquet(str(Path(output) / layout.CHANGES)).select(input_file_name().alias("f")).distinct()
    return {row["f"].rstrip("/").rsplit("/", 2)[-2] for row in files.collect()}


def assert_exactly_once(spark: Any, capture: Capture, *, inserted: int, updated: int = 0, deleted: int = 0) -> None:
    rows = read_output(spark, capture.output)
    keys = {(r["commit_lsn"], r["seq"]) for r in rows}
    assert len(keys) == len(rows), f"{len(rows) - len(keys)} change(s) written twice"
    ids = sorted(int(r["after"]["id"]) for r in rows if r["op"] == "I")
    assert ids == list(range(1, inserted + 1)), f"{len(ids)} insert(s) in the output, {inserted} made"
    assert sum(1 for r in rows if r["op"] == "U") == updated
    assert sum(1 for r in rows if r["op"] == "D") == deleted
    summary = summarize(capture.output)
    assert summary.rows == len(rows)
    assert confirmed_lsn(capture.db, capture.slot) == str(summary.high_water_mark)
    recorded = recorded_partitions(capture.output)
    assert partition_dirs(capture.output) == recorded
    assert spark_partitions(spark, capture.output) <= recorded


def wait_slot_idle(db: Any, slot: str, timeout: float = 60) -> None:
    """Until no backend holds the slot (a killed run's peek may still be finishing on the server)."""
    deadline = time.monotonic() + timeout
    while db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0]:
        if time.monotonic() > deadline:
            raise AssertionError(f"slot {slot} still active after {timeout} s")
        time.sleep(0.2)


def plan_files(output: str) -> set[str]:
    staging = Path(output) / layout.STAGING
    return {p.name for p in staging.iterdir() if p.name.endswith(layout.PLAN_SUFFIX)} if staging.exists() else set()


def wait_for_work(output: str, head: int, old_plans: set[str], timeout: float = 180) -> None:
    """Until some run has planned a new batch or published a record after ``head``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if plan_files(output) - old_plans:
            return
        if (Path(output) / layout.META).exists() and CommitLog(open_output(output)).head() > head:
            return
        time.sleep(0.1)
    raise AssertionError(f"no run planned a batch within {timeout} s")


def write_round(db: Any, first_id: int, count: int, per_tx: int = 50) -> None:
    """``count`` inserts in transactions of ``per_tx`` rows (so batches end at many points)."""
    conn = db.connect(autocommit=True)
    with conn.cursor() as cur:
        for start in range(first_id, first_id + count, per_tx):
            cur.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g",
                        (start, min(start + per_tx, first_id + count) - 1))


# --- a: racing runs through a transaction pooler ---------------------------------------------------------------------


@pytest.mark.parametrize("pool_mode", ["transaction"])
@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_racing_runs_through_a_transaction_pooler_without_the_lease_write_every_change_once(
    db: Any, pooled_dsn: str, spark: Any, tmp_path: Path, plugin: str
) -> None:
    capture = make_capture(db, plugin, tmp_path / "out")
    rng = random.Random(f"fencing-{plugin}")
    inserted = updated = deleted = 0
    for round_no in range(ROUNDS):
        write_round(db, inserted + 1, 1200)
        inserted += 1200
        updated += len(db.execute("UPDATE items SET v = v || '+' WHERE id %% 40 = %s RETURNING id", (round_no,)))
        deleted += len(db.execute("DELETE FROM items WHERE id %% 97 = %s RETURNING id", (round_no,)))
        wait_slot_idle(db, capture.slot)
        head, old_plans = summarize(capture.output).head, plan_files(capture.output)
        jobs = [start_job(pooled_dsn, capture.args("--batch-changes", str(n)), tmp_path / f"r{round_no}-{n}.log")
                for n in BATCH_CHANGES]
        with reaped(jobs), Watcher(capture.output) as watcher:
            wait_for_work(capture.output, head, old_plans)
            time.sleep(rng.uniform(0.0, 3.0))
            jobs[rng.randrange(len(jobs))].kill()
            codes = [job.wait() for job in jobs]
        assert set(codes) <= ALLOWED_EXITS, [(c, j.stderr()) for c, j in zip(codes, jobs, strict=True) if c not in ALLOWED_EXITS]
        watcher.check()
        assert spark_partitions(spark, capture.output) <= recorded_partitions(capture.output)

    wait_slot_idle(db, capture.slot)
    final = ingest(pooled_dsn, *capture.args("--batch-changes", "700"))
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=inserted, updated=updated, deleted=deleted)
    assert final.summary is not None and final.summary["fenced"] is True


# --- b: the control connection terminated mid-batch while a second run starts ---------------------------------------


def test_a_run_losing_its_control_connection_while_a_second_starts_loses_and_duplicates_nothing(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    write_round(db, 1, 6000, per_tx=100)
    monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")  # for the second run, in this process
    first = start_job(db.dsn, capture.args("--batch-changes", "600"), tmp_path / "first.log")
    second: dict[str, Any] = {}
    with reaped([first]), Watcher(capture.output) as watcher:
        deadline = time.monotonic() + 180
        while summarize(capture.output).head < 1:  # committed one batch: now in the middle of the next
            assert first.proc.poll() is None, first.stderr()
            assert time.monotonic() < deadline, "no batch committed within 180 s"
            time.sleep(0.1)
        terminated = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()", (f"pgpoll ingest {capture.slot} (control)",),
        )[0][0]
        # The second run starts at once (in this process: its Spark is up already), while the first is mid-batch.
        thread = threading.Thread(target=lambda: second.update(result=ingest(db.dsn, *capture.args("--batch-changes", "900"))))
        thread.start()
        first_code = first.wait()
        thread.join(timeout=300)
    assert terminated >= 1
    assert "result" in second, "the second run raised (see the captured output)"
    result = second["result"]
    assert first_code in (0, 3) and result.exit_code in (0, 3), (first_code, first.stderr(), result.stderr[-3000:])
    watcher.check()
    wait_slot_idle(db, capture.slot)
    final = ingest(db.dsn, *capture.args())
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=6000)


# --- c: through PgBouncer the output is the same as through a direct connection, value for value -------------------

VALUES_TABLE = """
CREATE TABLE vals (id int PRIMARY KEY, ts timestamptz, d date, iv interval, f8 float8, b bytea, n numeric(12,3),
                   t timestamp)
"""
VALUES_WRITES = (
    "INSERT INTO vals VALUES (1, '2024-03-10 01:31:00+00', '2024-03-09', '1 day 02:03:04.5', 0.1, '\\x00ff27', 1.5, "
    "'2024-03-09 20:31:00'), (2, '1999-12-31 23:59:59.999999+00', '2000-02-29', '-3 mons 4 days', 1e300, '', -0.001, "
    "'infinity'), (3, '-infinity', '0044-03-15 BC', '0', 'NaN', '\\x', 'NaN', '2024-01-01 00:00:00.000001')",
    "UPDATE vals SET ts = ts + interval '1 hour', f8 = 2.2250738585072014e-308, b = '\\xdeadbeef', n = n * 3 "
    "WHERE id = 1",
    "DELETE FROM vals WHERE id = 2",
)
COMPARED = ("commit_lsn", "lsn", "xid", "commit_ts", "op", "schema_name", "table_name", "before", "after",
            "unchanged_toast")


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_an_ingest_through_the_pooler_writes_what_a_direct_ingest_writes(
    db: Any, pgbouncer: Any, pooled_dsn: str, spark: Any, tmp_path: Path, plugin: str
) -> None:
    db.require_plugin(plugin)
    for setting in ("TimeZone = 'America/New_York'", "DateStyle = 'SQL, DMY'", "IntervalStyle = 'sql_standard'",
                    "extra_float_digits = 0", "bytea_output = 'escape'"):
        db.execute(f'ALTER DATABASE "{db.name}" SET {setting}')
    db.execute(VALUES_TABLE)
    db.execute("ALTER TABLE vals REPLICA IDENTITY FULL")  # before maps with every column
    db.execute("CREATE PUBLICATION pub_vals FOR TABLE vals")
    slots = [db.slot_name(), db.slot_name()]
    for slot in slots:
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    for statement in VALUES_WRITES:
        db.execute(statement)
    # Other clients leave session-level SETs behind on the pool's server connections.
    pgbouncer.fill_pool(db.name, ("SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'German'",
                                  "SET extra_float_digits = 3", "SET bytea_output = 'escape'"))
    outputs = {"direct": str(tmp_path / "direct"), "pooled": str(tmp_path / "pooled")}
    pub = ["--publication", "pub_vals"] if plugin == "pgoutput" else []
    for (how, output), slot, dsn in zip(outputs.items(), slots, (db.dsn, pooled_dsn), strict=True):
        result = ingest(dsn, "--slot", slot, "--output", output, *pub)
        assert result.exit_code == 0, (how, result.stderr)

    def changes(output: str) -> list[dict[str, Any]]:
        return [{k: r[k] for k in COMPARED} for r in read_output(spark, output) if r["table_name"] == "vals"]

    direct, pooled = changes(outputs["direct"]), changes(outputs["pooled"])
    assert [r["op"] for r in direct] == ["I", "I", "I", "U", "D"]
    assert pooled == direct
    first = direct[0]["after"]
    assert first["ts"].startswith("2024-03-10 01:31:00") and first["d"] == "2024-03-09"  # pinned, not the database's
    assert first["b"] == "\\x00ff27" and first["f8"] == "0.1" and first["iv"] == "1 day 02:03:04.5"


# --- d: kills while a checkpoint is written --------------------------------------------------------------------------

CHECKPOINT_KILLER = '''
"""jobs/ingest.py with a checkpoint every 2 records, killed (with its JVM) while writing its first new checkpoint."""
import os, runpy, signal, sys, uuid

from pgpoll.sink.commit import batches, log as commit_log, recovery
from pgpoll.sink.stores.filesystem import local_path

batches.CHECKPOINT_EVERY = recovery.CHECKPOINT_EVERY = 2
MODE = os.environ["FENCING_CHECKPOINT_KILL"]
real = commit_log.CommitLog.write_checkpoint


def write_checkpoint(self, state, upto, run=None):
    if state.checkpoint is not None and state.checkpoint.seq >= upto:
        return False
    directory = local_path(self.checkpoint_dir)
    final = os.path.join(directory, commit_log.record_name(upto))
    if os.path.exists(final):
        return real(self, state, upto, run)
    text = state.fold(upto, run).to_json()
    os.makedirs(directory, exist_ok=True)
    if MODE == "short":  # a store without links: killed while writing the final name itself
        with open(final, "w") as f:
            f.write(text[: len(text) // 2])
    else:  # "linked": killed after the checkpoint appeared, its temp file of a concurrent try left half written
        with open(os.path.join(directory, f"_tmp.{uuid.uuid4().hex}.{commit_log.record_name(upto)}"), "w") as f:
            f.write(text[: len(text) // 2])
        assert real(self, state, upto, run)
    sys.stderr.write(f"checkpoint {upto}: killed ({MODE})\\n")
    sys.stderr.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


commit_log.CommitLog.write_checkpoint = write_checkpoint
sys.argv = [os.path.join(sys.argv[1], "jobs", "ingest.py"), *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_kills_while_checkpoints_are_written_lose_and_duplicate_nothing(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    write_round(db, 1, 400, per_tx=50)
    killer = tmp_path / "checkpoint_killer.py"
    killer.write_text(CHECKPOINT_KILLER)
    for mode in ("short", "linked"):  # killed in batch 2 and in batch 3
        job = start_job(db.dsn, [str(REPO), *capture.args("--batch-changes", "50")], tmp_path / f"{mode}.log",
                        env={"FENCING_CHECKPOINT_KILL": mode}, script=killer)
        with reaped([job]):
            code = job.wait()
        assert code == -signal.SIGKILL and f"killed ({mode})" in job.stderr(), (mode, code, job.stderr())
        wait_slot_idle(db, capture.slot)
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 2)
    monkeypatch.setattr(recovery, "CHECKPOINT_EVERY", 2)
    final = ingest(db.dsn, *capture.args("--batch-changes", "50"))
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=400)

    # Every checkpoint that can be read folds exactly the records it names; the one cut short is skipped.
    log = CommitLog(open_output(capture.output))
    records = log.records()
    everything = LogState(head=len(records), checkpoint=None, tail=tuple(records))
    checkpoints = Path(capture.output) / layout.CHECKPOINTS
    readable, unreadable = 0, []
    for path in sorted(checkpoints.glob("seq-*.json")):
        try:
            checkpoint = Checkpoint.from_json(path.read_text())
        except ValueError:
            unreadable.append(path.name)  # the "short" kill's
            continue
        expected = everything.fold(checkpoint.seq)
        assert (checkpoint.high_water_mark, checkpoint.records, checkpoint.rows, checkpoint.partitions) == (
            expected.high_water_mark, expected.records, expected.rows, expected.partitions)
        readable += 1
    assert readable >= 2 and len(unreadable) == 1, (readable, unreadable)
    state = log.state()
    assert state.checkpoint is not None and state.high_water_mark == everything.high_water_mark
