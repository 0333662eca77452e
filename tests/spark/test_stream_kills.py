"""Issue 25's proof: a pgpoll stream writes every change exactly once through SIGKILLs of its driver.

One table and its slots: an application writes meanwhile
(small transactions, larger ones past ``maxRowsPerTrigger``, updates,
deletes, a logical message, writes to a table the stream leaves out), and a
Spark application (``tests/spark/stream_job.py``: ``availableNow`` queries
into a Parquet file sink, one per plugin, pgoutput's with ``maxRowsPerTrigger``,
test_decoding's without a limit, and one ``foreachBatch`` into Delta
with delta-rs's application transaction) is SIGKILLed, with its JVM, at random
points over several runs, each restarted from its checkpoints. Then:

- each Parquet sink read through Spark (which honours the sink's own log) and
  the Delta table (its current version's files) hold exactly the changes an
  oracle slot of the same plugin, created with the others and never consumed,
  holds (a batch
  read of that slot: the server is the oracle), row for row;
- while the runs went on, a sampler never saw a slot past the end of the
  newest batch its query's checkpoint records as committed (``commits/N``'s
  ``offsets/N``): the slot never moves past what the sink has.

``PGPOLL_TEST_STREAM_KILLS`` sets the killed runs (default 3).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pgpoll.spark
from pgpoll.lsn import Lsn
from pgpoll.sink.envelope import ENVELOPE_SCHEMA

REPO = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("PGPOLL_TEST_STREAM_KILLS", "3"))
MAX_ROWS = 2000
LARGE = 3  # transactions larger than MAX_ROWS the writer makes
BUDGET = 10_000  # rows the writer inserts at most
COMPARED = ("commit_lsn", "lsn", "seq", "xid", "commit_ts", "op", "schema_name", "table_name", "before", "after",
            "unchanged_toast", "message_prefix", "message_content", "transactional", "schema_id")


# --- the application writing meanwhile ------------------------------------------------------------------------------


@dataclass
class Writer:
    """Writes transactions of every shape until stopped; counts the inserted ids."""

    dsn: str
    seed: str
    next_id: int = 1
    large: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def one(self, cur: Any, rng: random.Random) -> None:
        roll = rng.random()
        if roll < 0.06 and self.large < LARGE:  # larger than maxRowsPerTrigger: passes whole
            n = rng.randint(MAX_ROWS + 1, 2 * MAX_ROWS)
            self.large += 1
        else:
            n = rng.randint(1, 20)
        cur.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (self.next_id, self.next_id + n - 1))
        self.next_id += n
        if roll > 0.7:
            cur.execute("UPDATE items SET v = v || '+' WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 5)")
        if roll > 0.9:
            cur.execute("DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 2)")
        if 0.5 < roll < 0.55:
            cur.execute("SELECT pg_logical_emit_message(true, 'app', 'note')")
        if 0.3 < roll < 0.4:
            cur.execute("INSERT INTO other VALUES (%s) ON CONFLICT DO NOTHING", (self.next_id,))

    def _run(self) -> None:
        rng = random.Random(self.seed)
        try:
            conn = psycopg2.connect(self.dsn)
            while not self.stop.is_set():
                if self.next_id > BUDGET:  # bounded work, however slow the machine makes the runs
                    time.sleep(0.1)
                    continue
                with conn, conn.cursor() as cur:  # one transaction
                    self.one(cur, rng)
                time.sleep(rng.uniform(0.05, 0.25))
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error.append(exc)

    def __enter__(self) -> Writer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


# --- the slots against the checkpoints ------------------------------------------------------------------------------


def committed_end(checkpoint: Path) -> Lsn | None:
    """The end offset of the newest batch the checkpoint records as committed (None: none yet)."""
    commits = sorted((int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")), reverse=True) \
        if (checkpoint / "commits").exists() else []
    for batch in commits:
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
            return Lsn.parse(json.loads(lines[2])["lsn"])
    return None


@dataclass
class Sampler:
    """Polls each slot's position, then its checkpoint: the slot must never be past the newest committed end."""

    db: Any
    watched: dict[str, tuple[Path, Lsn]]  # slot -> (checkpoint, position at creation)
    problems: list[str] = field(default_factory=list)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        conn = self.db.connect()
        while not self.stop.wait(0.1):
            for slot, (checkpoint, created) in self.watched.items():
                with conn.cursor() as cur:
                    cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                    position = Lsn.parse(cur.fetchone()[0])
                end = committed_end(checkpoint)  # read after the slot: at least as new as what allowed its position
                if position > (end if end is not None else created):
                    self.problems.append(f"{slot} at {position}, its checkpoint's committed end {end}")
                self.samples += 1

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=30)


# --- the job ---------------------------------------------------------------------------------------------------------


def start_job(dsn: str, queries: list[dict[str, Any]], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, str(REPO / "tests" / "spark" / "stream_job.py"),
                                 *[json.dumps(q) for q in queries]], env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)


def environmental(log: Path) -> bool:
    """A run that died of the machine, not of pgpoll: a Python worker slower to start than Spark's fixed 10 s.

    (``PythonWorkerFactory.createSimpleWorker`` waits 10 s for a new worker to
    connect back; on an overloaded machine one can take longer.) Such a run is
    one more crash at an arbitrary point, which is what this test is about.
    """
    return "Python worker failed to connect back" in log.read_text(errors="replace")


def kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def batches_planned(queries: list[dict[str, Any]]) -> int:
    return sum(len(list((Path(q["checkpoint"]) / "offsets").glob("[0-9]*"))) for q in queries
               if (Path(q["checkpoint"]) / "offsets").exists())


def wait_for_a_batch(job: subprocess.Popen[bytes], queries: list[dict[str, Any]], timeout: float = 180) -> None:
    """Until the job plans a new batch (or ends): a kill after that lands in the middle of the work."""
    before = batches_planned(queries)
    deadline = time.monotonic() + timeout
    while job.poll() is None and batches_planned(queries) == before:
        assert time.monotonic() < deadline, f"no batch planned within {timeout} s"
        time.sleep(0.1)


def wait_slots_idle(db: Any, slots: list[str], timeout: float = 60) -> None:
    """Until no backend holds the slots (a killed job's peek may still be finishing on the server)."""
    deadline = time.monotonic() + timeout
    while db.execute("SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = ANY(%s)", (slots,))[0][0]:
        assert time.monotonic() < deadline, f"slots {slots} still active after {timeout} s"
        time.sleep(0.2)


def canonical(table: pa.Table) -> pa.Table:
    """The compared columns as the envelope types, in ``(commit_lsn, seq)`` order (Arrow compares them fast)."""
    schema = pa.schema([ENVELOPE_SCHEMA.field(name) for name in COMPARED])
    return table.select(list(COMPARED)).cast(schema).sort_by([("commit_lsn", "ascending"), ("seq", "ascending")])


def duplicates(table: pa.Table) -> int:
    """Changes present more than once (by ``(commit_lsn, seq)``)."""
    return table.num_rows - table.group_by(["commit_lsn", "seq"]).aggregate([]).num_rows


def assert_same(got: pa.Table, expected: pa.Table, what: str) -> None:
    assert duplicates(got) == 0, f"{what}: {duplicates(got)} change(s) written twice"
    if not got.equals(expected):
        left, right = got.to_pylist(), expected.to_pylist()
        first = next((i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right)))
        raise AssertionError(f"{what}: {len(left)} row(s), expected {len(right)}; first difference at row {first}: "
                             f"{left[first] if first < len(left) else None} != {right[first] if first < len(right) else None}")


def delta_rows(path: Path) -> pa.Table:
    """The Delta table's current version, read from the files its log names (no deltalake scan)."""
    from deltalake import DeltaTable

    files = DeltaTable(str(path)).file_uris()
    return pa.concat_tables([pq.read_table(f.removeprefix("file://")) for f in files]) if files else pa.table({})


def _oracle(spark: Any, db: Any, slot: str, common: dict[str, str]) -> pa.Table:
    reader = spark.read.format("pgpoll").option("slot", slot).option("dsn", db.dsn)
    for name, value in common.items():
        reader = reader.option(name, value)
    return canonical(reader.load().toArrow())


@pytest.mark.slow
def test_killed_stream_drivers_lose_and_duplicate_nothing(db: Any, spark: Any, tmp_path: Path) -> None:
    plugins = [p for p in ("pgoutput", "test_decoding") if p in db.plugins]
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    roles = {plugin: ("pq", "dl", "or") if plugin == plugins[0] else ("pq", "or") for plugin in plugins}
    slots = {(plugin, role): db.slot_name(f"{plugin[:2]}{role}") for plugin in plugins for role in roles[plugin]}
    for (plugin, _role), slot in slots.items():
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    created = {slot: Lsn.parse(db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                          (slot,))[0][0]) for slot in slots.values()}
    common = {"pgoutput": {"publication": "pub"}, "test_decoding": {"tables": "public.items"}}
    # the first plugin's queries find each batch's end by a decode (a limit); the other's has no limit: each of its
    # runs is one batch ending at a message the run wrote (both ways through the kills)
    limits = {plugin: {"maxRowsPerTrigger": MAX_ROWS} if plugin == plugins[0] else {} for plugin in plugins}
    queries = [
        {"slot": slots[(plugin, role)], "sink": sink, "path": str(tmp_path / f"{plugin}-{sink}"),
         "checkpoint": str(tmp_path / f"ck-{plugin}-{sink}"), **limits[plugin], **common[plugin]}
        for plugin in plugins for role, sink in (("pq", "parquet"), ("dl", "delta")) if role in roles[plugin]
    ]
    watched = {q["slot"]: (Path(q["checkpoint"]), created[q["slot"]]) for q in queries}
    rng = random.Random("stream-kills")
    killed = 0
    t0 = time.monotonic()
    with Writer(db.dsn, "writer") as writer, Sampler(db, watched) as sampler:
        for run in range(KILLS):
            log = tmp_path / f"job-{run}.log"
            job = start_job(db.dsn, queries, log)
            try:
                wait_for_a_batch(job, queries)
                time.sleep(rng.uniform(0.0, 4.0))
                if job.poll() is None:
                    killed += 1
            finally:
                kill(job)
            assert job.returncode in (0, -signal.SIGKILL) or environmental(log), log.read_text()[-3000:]
            wait_slots_idle(db, [q["slot"] for q in queries])
        time.sleep(1.0)
    assert not writer.error, writer.error
    assert killed >= 1, "no run was killed: every run ended before its kill"
    print("kills", time.monotonic() - t0, writer.next_id)
    # a clean run after the writes stopped: it must catch up from whatever the kills left
    with Sampler(db, watched) as last_sampler:
        for attempt in range(3):
            log = tmp_path / f"final-{attempt}.log"
            job = start_job(db.dsn, queries, log)
            if job.wait(timeout=600) == 0 or not environmental(log):
                break
            wait_slots_idle(db, [q["slot"] for q in queries])
        assert job.returncode == 0, log.read_text()[-3000:]
    print("final", time.monotonic() - t0)
    assert sampler.samples > 0 and not sampler.problems, sampler.problems[:5]
    assert not last_sampler.problems, last_sampler.problems[:5]

    pgpoll.spark.register(spark)
    for plugin in plugins:
        expected = _oracle(spark, db, slots[(plugin, "or")], common[plugin])
        inserted = [dict(r["after"])["id"] for r in expected.select(["op", "after"]).to_pylist() if r["op"] == "I"]
        assert sorted(map(int, inserted)) == list(range(1, writer.next_id)), f"{plugin}: the oracle misses inserts"
        assert_same(canonical(spark.read.parquet(str(tmp_path / f"{plugin}-parquet")).toArrow()), expected,
                    f"{plugin}, Parquet sink")
        if "dl" in roles[plugin]:
            assert_same(canonical(delta_rows(tmp_path / f"{plugin}-delta")), expected, f"{plugin}, Delta table")
    print("compared", time.monotonic() - t0)
    for q in queries:  # the last run ended with latestOffset at its last batch's end: the slot is there
        position = db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                              (q["slot"],))[0][0]
        assert Lsn.parse(position) == committed_end(Path(q["checkpoint"]))
