"""The rare case of chunked reads, forced: rows whose key changes between two chunks' reads, with an unchanged
TOASTed value, from a chunk not read yet into one already read (and a chain of two such moves).

Neither chunk holds such a row and the UPDATE does not carry its TOASTed value: only the snapshot's recheck
(``pgpoll.snapshot.recheck``) has it. The moves are timed between the chunks' reads through the tasks' test
pause (``PGPOLL_SNAPSHOT_TEST_PAUSE_DIR``): a task waits before each chunk until the test lets it go.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgpoll.snapshot.chunk_task import PAUSE_ENV
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize, state_rows
from tests.materialize.test_mirror import _assert_mirror
from tests.snapshot.test_snapshot_mirror import snapshot

_BIG = "SELECT string_agg(md5(g::text || {seed}), '') FROM generate_series(1, 120) g"  # 3.8 kB: stored out of line


class Conductor(threading.Thread):
    """Lets each paused chunk go, running the test's action for that chunk first (in the chunk's gap)."""

    def __init__(self, pause: Path, actions: dict[str, Callable[[], None]]) -> None:
        super().__init__(daemon=True)
        self.pause, self.actions = pause, actions
        self.done = threading.Event()
        self.ran: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                for ready in sorted(self.pause.glob("*.ready")):
                    name = ready.name[: -len(".ready")]
                    if (self.pause / f"{name}.go").exists():
                        continue
                    if name in self.actions:
                        self.actions[name]()
                        self.ran.append(name)
                    (self.pause / f"{name}.go").touch()
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc
            for ready in self.pause.glob("*.ready"):
                (self.pause / f"{ready.name[: -len('.ready')]}.go").touch()


def test_rows_moved_into_chunks_already_read_keep_their_unchanged_toasted_values(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE moved (id int PRIMARY KEY, big text, note text)")
    db.execute("ALTER TABLE moved ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line, uncompressed
    for i in range(2, 61, 2):  # rows from before the slot: only the snapshot has their values
        db.execute(f"INSERT INTO moved VALUES (%s, ({_BIG.format(seed=i)}), 'n')", (i,))
    assert db.execute("SELECT count(*) FROM moved WHERE pg_column_size(big) < octet_length(big)")[0][0] == 0
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE moved")
    before = dict(db.execute("SELECT id, md5(big) FROM moved"))
    out = tmp_path / "out"
    args = ["--slot", slot, "--publication", "p", "--output", str(out)]
    pause = tmp_path / "pause"
    pause.mkdir()
    monkeypatch.setenv(PAUSE_ENV, str(pause))
    # chunks of 10 rows: 0 = ids up to 20, 1 = up to 40, 2 = the rest; read in that order (one task)
    conductor = Conductor(pause, {
        # between chunk 0 and chunk 1: 50 (chunk 2, not read) moves to 3 (chunk 0, read) -- the case;
        # 52 moves to 7 (chunk 0) -- the first move of a chain
        "public.moved.1": lambda: db.execute("UPDATE moved SET id = 3 WHERE id = 50; UPDATE moved SET id = 7 WHERE id = 52"),
        # between chunk 1 and chunk 2: 7 (chunk 0) moves on to 35 (chunk 1, read) -- the chain's second move
        "public.moved.2": lambda: db.execute("UPDATE moved SET id = 35 WHERE id = 7"),
    })
    conductor.start()
    try:
        done = snapshot(db.dsn, *args, "--chunk-rows", "10", "--parallelism", "1")
    finally:
        conductor.done.set()
        conductor.join(timeout=30)
    assert conductor.error is None, conductor.error
    assert conductor.ran == ["public.moved.1", "public.moved.2"]
    assert done.exit_code == 0, done.stderr
    summary = done.summary
    assert summary is not None and summary["chunks"] == 4  # (and a last, empty one: ids above 60)
    assert summary["table_modes"]["public.moved"]["mode"] == "chunked"
    assert summary["table_modes"]["public.moved"]["recheck"] is True
    assert summary["recheck_rows"] >= 2  # the moved rows, at least (read again at their latest keys)
    assert ingest(db.dsn, *args, "--typed-tables").exit_code == 0
    code, tables, err = materialize(str(out))
    assert code == 0, err
    (state,) = tables
    assert state["snapshot"]["converged"] is True and not state["warnings"], state
    _assert_mirror(db, spark, out, "moved")
    rows = {r["id"]: r for r in state_rows(spark, str(out), "public", "moved")}
    assert 3 in rows and 35 in rows and 50 not in rows and 7 not in rows and 52 not in rows
    got = dict(db.execute("SELECT id, md5(big) FROM moved WHERE id IN (3, 35)"))
    assert got == {3: before[50], 35: before[52]}  # the values from before the moves, at the final keys
