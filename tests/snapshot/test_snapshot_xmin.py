"""No snapshot held longer than one chunk's read: a sampler watches every pgpoll backend's ``backend_xmin``.

While a table with text and jsonb columns is read in 50+ chunks and the application updates, deletes and
inserts rows, a sampler on another connection reads ``pg_stat_activity`` every 50 ms. A backend *holds* one
snapshot from the first sample that shows its ``backend_xmin`` to the last one in the same transaction. In
the default mode no hold may outlast the longest chunk's read plus one second, although the run pauses 1.5 s
between two chunks (the tasks' test pause); under ``--mode shared`` the same pause falls inside the exported
snapshot's life and the sampler must catch it (so the test can fail). The state afterwards equals the source.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from pgpoll.snapshot.chunk_task import PAUSE_ENV
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize
from tests.materialize.test_mirror import _assert_mirror
from tests.snapshot.test_snapshot_key_moves import Conductor
from tests.snapshot.test_snapshot_mirror import snapshot


class Sampler(threading.Thread):
    """Every 50 ms: how long each pgpoll backend has held its current snapshot (per backend and transaction)."""

    def __init__(self, db: Any) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.stop = threading.Event()
        self.holds: dict[tuple[int, str, str], list[float]] = {}
        self.samples = 0

    def run(self) -> None:
        conn = self.db.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute("SELECT pid, xact_start::text, backend_xmin::text FROM pg_stat_activity "
                                "WHERE application_name LIKE 'pgpoll%%' AND backend_xmin IS NOT NULL "
                                "AND datname = current_database()")
                    now = time.monotonic()
                    self.samples += 1
                    for pid, started, xmin in cur.fetchall():
                        seen = self.holds.setdefault((int(pid), str(started), str(xmin)), [now, now])
                        seen[1] = now
                    time.sleep(0.05)
        finally:
            conn.close()

    def longest(self) -> float:
        return max((last - first for first, last in self.holds.values()), default=0.0)


class Application(threading.Thread):
    """Short transactions against the table while it is read: updates, deletes, inserts."""

    def __init__(self, db: Any) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        conn = self.db.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                next_id = 100_000
                while not self.stop.is_set():
                    victim = rng.randint(1, 2_400)
                    cur.execute(rng.choice([
                        "UPDATE sampled SET t = t || 'x', j = jsonb_set(j, '{n}', to_jsonb(%s)) WHERE id = %s",
                        "UPDATE sampled SET j = j || jsonb_build_object('u', %s) WHERE id = %s",
                        "DELETE FROM sampled WHERE id = %s OR id = %s",
                    ]), (rng.randint(0, 99), victim))
                    next_id += 1
                    cur.execute("INSERT INTO sampled VALUES (%s, repeat('n', 50), '{\"k\": 1}') ON CONFLICT DO NOTHING",
                                (next_id,))
                    time.sleep(0.01)
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()


def _held(out: Path, snapshot_id: str) -> float:
    """The longest a chunk or recheck piece of the run held its snapshot (its manifest's held_s)."""
    files = (out / "_pgpoll" / "snapshots" / snapshot_id).glob("*/chunk-*.json")  # checkout-paths: data
    return max(float(json.loads(f.read_text()).get("held_s", 0.0)) for f in files)


def _watched(db: Any, tmp_path: Path, monkeypatch: Any, out: Path, args: list[str]) -> tuple[Any, Sampler]:
    pause = tmp_path / f"pause-{out.name}"
    pause.mkdir()
    monkeypatch.setenv(PAUSE_ENV, str(pause))
    conductor = Conductor(pause, {"public.sampled.10": lambda: time.sleep(1.5)})
    sampler, app = Sampler(db), Application(db)
    for thread in (conductor, sampler, app):
        thread.start()
    try:
        done = snapshot(db.dsn, *args, "--output", str(out), "--chunk-rows", "40", "--parallelism", "2")
    finally:
        for thread in (app, sampler):
            thread.stop.set()
            thread.join(timeout=30)
        conductor.done.set()
        conductor.join(timeout=30)
    assert conductor.error is None and app.error is None, (conductor.error, app.error)
    assert conductor.ran == ["public.sampled.10"]
    assert done.exit_code == 0, done.stderr
    assert sampler.samples > 20
    return done.summary, sampler


def test_no_backend_holds_a_snapshot_longer_than_a_chunk_and_shared_mode_is_caught(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE sampled (id int PRIMARY KEY, t text, j jsonb)")
    db.execute("INSERT INTO sampled SELECT g, repeat(md5(g::text), 1 + g % 5), "
               "jsonb_build_object('n', g, 'tags', jsonb_build_array(g % 7, md5(g::text))) FROM generate_series(1, 2400) g")
    db.execute("ANALYZE sampled")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE sampled")
    args = ["--slot", slot, "--publication", "p"]

    out = tmp_path / "out"
    summary, sampler = _watched(db, tmp_path, monkeypatch, out, args)
    assert summary["chunks"] >= 50 and summary["table_modes"]["public.sampled"]["mode"] == "chunked"
    bound = _held(out, summary["snapshot_id"]) + 1.0
    assert sampler.holds and sampler.longest() <= bound, (sampler.longest(), bound)
    assert summary["longest_snapshot_s"] + 1.0 <= bound + 1e-6

    shared = tmp_path / "shared"
    shared_summary, shared_sampler = _watched(db, tmp_path, monkeypatch, shared, [*args, "--mode", "shared"])
    assert shared_summary["table_modes"]["public.sampled"] == {
        "mode": "shared", "why": "--mode shared", "chunks": shared_summary["chunks"], "recheck": False}
    assert shared_sampler.longest() > bound, (shared_sampler.longest(), bound)  # the exported snapshot, held
    assert shared_summary["longest_snapshot_s"] > 1.5

    assert ingest(db.dsn, *args, "--output", str(out), "--typed-tables").exit_code == 0
    code, tables, err = materialize(str(out))
    assert code == 0, err
    assert tables[0]["snapshot"]["converged"] is True and not tables[0]["warnings"], tables
    _assert_mirror(db, spark, out, "sampled")
