"""Issue 35's proof for ``pgpoll compact``: compactions (some SIGKILLed) while three ingests race with SIGKILLs, a
``materialize`` runs and a reader polls the change log by LSN range; then every change is in the change log, its
Delta table and the typed table exactly once, the state equals ``SELECT *``, and the change log is a few files.

The leases are off (``PGPOLL_TEST_NO_LOCK=1``): only the commit log's and the compaction log's compare-and-sets
keep the runs apart. About a minute: each round starts three ingest processes and compactions beside them, which
is what the test is about.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes_arrow
from pgpoll.sink.commit.compactions import CompactionLog
from pgpoll.sink.commit.log import summarize
from pgpoll.sink.stores.filesystem import open_output
from tests.housekeeping.test_compact import compact, delta_changes, materialize, state_rows, typed_rows
from tests.ingest.conftest import REPO, ingest, make_capture
from tests.ingest.test_fencing import ALLOWED_EXITS, NO_LOCK, reaped, start_job, wait_slot_idle, write_round

ROUNDS = 3


@dataclass
class Poller:
    """Reads the change log with pgpoll.reader again and again: each change once, and below a high-water mark seen
    before a read, the same changes at every later read (a compaction moves rows, never changes what a range holds)."""

    output: str
    polls: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Poller:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        below: int | None = None
        held: set[tuple[int, int]] = set()
        while not self._stop.wait(0.2):
            try:
                mark = summarize(self.output).high_water_mark  # before the read: every record up to it is committed
                table = read_changes_arrow(self.output)
            except Exception as exc:
                self.errors.append(f"read failed: {exc}")
                continue
            keys = list(zip(table.column("commit_lsn").to_pylist(), table.column("seq").to_pylist(), strict=True))
            if len(set(keys)) != len(keys):
                self.errors.append(f"{len(keys) - len(set(keys))} change(s) read twice")
            if below is not None and {k for k in keys if k[0] <= below} != held:
                self.errors.append(f"the changes up to {Lsn(below)} differ from an earlier read")
            if mark is not None:
                below, held = int(mark), {k for k in keys if k[0] <= int(mark)}
            self.polls += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


@dataclass
class Compactor:
    """``pgpoll compact`` processes one after the other, about one in three SIGKILLed at a random moment."""

    output: str
    exits: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Compactor:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), **NO_LOCK)
        code = "from pgpoll.cli.main import main; main()"
        while not self._stop.is_set():
            proc = subprocess.Popen([sys.executable, "-c", code, "compact", "--output", self.output, "--min-age", "0",
                                     "--grace", "10", "--target-size", "64KB"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            if random.random() < 0.35:
                time.sleep(random.uniform(0.3, 1.5))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self.exits.append(proc.wait(timeout=120))
            self._stop.wait(0.3)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=150)


def test_compaction_beside_racing_killed_ingests_materialize_and_a_polling_reader(
    db: Any, tmp_path: Path, spark: Any
) -> None:
    random.seed(35)
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    out = capture.output
    db.execute("INSERT INTO items VALUES (0, 'seed')")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0  # the output exists for the pollers
    inserted, updated, deleted = 1, 0, 0
    poller, compactor = Poller(out).start(), Compactor(out).start()
    try:
        for round_ in range(ROUNDS):
            write_round(db, inserted, 240, per_tx=12)
            inserted += 240
            updated += len(db.execute("UPDATE items SET v = v || '+' WHERE id %% 5 = %s RETURNING id", (round_,)))
            deleted += len(db.execute("DELETE FROM items WHERE id %% 11 = %s RETURNING id", (round_ + 1,)))
            args = [capture.args("--typed-tables", "--batch-changes", str(n)) for n in (15, 35, 60)]
            logs = [tmp_path / f"ingest-{round_}-{i}.log" for i in range(3)]
            with reaped([start_job(db.dsn, a, log) for a, log in zip(args, logs, strict=True)]) as jobs:
                time.sleep(random.uniform(1.0, 3.0))
                random.choice(jobs).kill()
                codes = [job.wait() for job in jobs]
            assert set(codes) <= ALLOWED_EXITS, [(c, j.stderr()) for c, j in zip(codes, jobs, strict=True)]
            materialize(out, tmp_path / "state")  # beside the compactions
    finally:
        compactor.stop()
        poller.stop()
    wait_slot_idle(db, capture.slot)
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0  # a clean run takes what is left
    code, _summary, text = compact(out, "--grace", "0", "--target-size", "64KB")
    assert code == 0, text

    assert not poller.errors and poller.polls >= 10, (poller.polls, "\n".join(poller.errors[:5]))
    assert set(compactor.exits) <= {0, 3, -signal.SIGKILL} and 0 in compactor.exits, compactor.exits
    assert CompactionLog(open_output(out)).head() >= 2
    table = read_changes_arrow(out)
    keys = list(zip(table.column("commit_lsn").to_pylist(), table.column("seq").to_pylist(), strict=True))
    ops = table.column("op").to_pylist()
    assert len(set(keys)) == len(keys) == inserted + updated + deleted
    assert sorted(int(dict(a)["id"]) for a, op in zip(table.column("after").to_pylist(), ops, strict=True) if op == "I") == \
        list(range(inserted))
    assert (ops.count("U"), ops.count("D")) == (updated, deleted)
    assert sorted(delta_changes(out)) == sorted(zip(*(table.column(c).to_pylist() for c in ("commit_lsn", "seq", "op")),
                                                        strict=True))
    typed = typed_rows(spark, out)
    assert len(set(typed)) == len(typed) == len(keys)
    materialize(out, tmp_path / "state")
    materialize(out, tmp_path / "fresh")
    expected = sorted(tuple(r) for r in db.execute("SELECT id, v FROM items"))
    assert state_rows(tmp_path / "state") == state_rows(tmp_path / "fresh") == expected
    live = read_changes_arrow(out).num_rows
    files = len({f for f in (Path(out) / "changes").glob("lsn_range=*/*.parquet")})
    assert live == len(keys) and files <= 3, files  # the merges (at most 64 KB of small batches each) and the newest
