"""``pgpoll resync`` on the same output: a recreated slot, the gap marked, ingest resumes, every state exact again.

The changes written while the slot was gone (inserts, updates and deletes)
are in no batch; after ``resync`` the materialized state must equal
``SELECT *`` anyway, at the same path, and until the snapshot after the gap
is complete ``materialize`` refuses the table rather than build it without them. Parquet and Delta states;
a resync killed (SIGKILL) in its snapshot leaves the gap marked, and its rerun resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.reader import gaps
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.snapshot.chunk_task import PAUSE_ENV
from tests.ingest.conftest import Capture, ingest, make_capture
from tests.materialize.conftest import materialize, state_rows


def _resync(cap: Capture) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(cli, ["resync", "--slot", cap.slot, "--output", cap.output, "--publication", "pub_items",
                                      "--json"], env={"PGPOLL_DSN": cap.db.dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, lines[-1], result.stderr


def _killed_after_marking(cap: Capture, gate: Path) -> CommitRecord:
    """``pgpoll resync`` in its own process, SIGKILLed while its snapshot's chunk waits (PAUSE_ENV: tests only)."""
    gate.mkdir()
    env = dict(os.environ, PGPOLL_DSN=cap.db.dsn, PYSPARK_PYTHON=sys.executable, **{PAUSE_ENV: str(gate)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgpoll", "resync", "--slot", cap.slot, "--output", cap.output, "--publication",
         "pub_items", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(Path(cap.output).glob("_pgpoll/snapshots/*/plan.json")):  # checkout-paths: data
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    gap = next((r for r in reversed(CommitLog(open_output(cap.output)).records()) if r.is_gap), None)
    assert gap is not None and not list(Path(cap.output).glob("_pgpoll/snapshots/*/complete.json"))
    return gap


def _source(cap: Capture) -> list[dict[str, Any]]:
    return [{"id": i, "v": v} for i, v in cap.source_rows()]


def test_resync_after_a_recreated_slot_brings_the_state_equal_to_the_source(
    db: Any, tmp_path: Path, spark: Any,
) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 30) g")
    assert ingest(db.dsn, *cap.args("--typed-tables")).exit_code == 0
    code, _, err = materialize(cap.output)
    assert code == 0, err
    delta = str(tmp_path / "delta")
    code, _, err = materialize(cap.output, "--format", "delta", "--to", delta)
    assert code == 0, err
    delta_table = Path(delta) / table_dir_name("public", "items")
    before = DeltaTable(str(delta_table)).version()

    db.execute("SELECT pg_drop_replication_slot(%s)", (cap.slot,))  # the gap: in no batch, ever
    db.execute("DELETE FROM items WHERE id <= 5")
    db.execute("UPDATE items SET v = 'gap' WHERE id BETWEEN 6 AND 10")
    db.execute("INSERT INTO items SELECT g, 'gap' || g FROM generate_series(31, 35) g")
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (cap.slot,))
    db.execute("UPDATE items SET v = 'after' WHERE id = 11")
    refused = ingest(db.dsn, *cap.args("--typed-tables"))
    assert refused.exit_code == 4, refused.stderr

    no_pub = CliRunner().invoke(cli, ["resync", "--slot", cap.slot, "--output", cap.output], env={"PGPOLL_DSN": db.dsn})
    assert no_pub.exit_code == 2 and "pass --publication NAME" in no_pub.stderr  # refused before any marker
    assert not any(r.is_gap for r in CommitLog(open_output(cap.output)).records())
    gap = _killed_after_marking(cap, tmp_path / "gate")  # a resync SIGKILLed in its snapshot, the gap marked
    assert gap.kind == "gap" and gap.version == 3
    state = CommitLog(open_output(cap.output)).state()
    assert state.high_water_mark == gap.end_lsn  # the marker does not move the high-water mark

    resumed = ingest(db.dsn, *cap.args("--typed-tables"))  # at once, from the slot's new position
    assert resumed.exit_code == 0 and resumed.summary is not None and resumed.summary["changes"] == 1, resumed.stderr
    code, _, err = materialize(cap.output)
    assert code == 2 and "public.items: the output lacks the changes in" in err and "pgpoll resync" in err, err

    assert gaps(cap.output) == [{"seq": gap.seq, "after": gap.start, "through": gap.resume, "replaced_through": None}]
    listed = CliRunner().invoke(cli, ["batches", "--output", cap.output, "--json"])
    assert [json.loads(line) for line in listed.stdout.splitlines()][-1]["totals"]["gaps"] == 1
    code, summary, err = _resync(cap)  # finds the gap marked, resumes the killed run's snapshot
    assert code == 0 and summary["marked"] is False and summary["gap"]["seq"] == gap.seq, err
    assert summary["snapshot"]["status"] == "ok" and summary["snapshot"]["tables"] == 1
    assert summary["snapshot"]["resumed"] is True
    code, summary, _ = _resync(cap)
    assert code == 0 and summary["snapshot"] is None and "nothing to do" in summary["notes"][0]  # idempotent

    db.execute("DELETE FROM items WHERE id = 12")
    db.execute("UPDATE items SET v = 'later' WHERE id = 13")
    assert ingest(db.dsn, *cap.args("--typed-tables")).exit_code == 0
    code, _, err = materialize(cap.output)
    assert code == 0, err
    got = sorted(state_rows(spark, cap.output, "public", "items"), key=lambda r: r["id"])
    assert got == _source(cap)
    assert {r["id"] for r in got}.isdisjoint(range(1, 6)) and got[0]["v"] == "gap" and {31, 35} <= {r["id"] for r in got}
    code, _, err = materialize(cap.output, "--format", "delta", "--to", delta)  # the same Delta table, a new version
    assert code == 0, err
    table = DeltaTable(str(delta_table))
    assert table.version() > before
    assert sorted(table.to_pyarrow_table(columns=["id", "v"]).to_pylist(), key=lambda r: r["id"]) == _source(cap)


def _parquet_state(output: str, table: str) -> list[dict[str, Any]]:
    """A Parquet state's user columns, read with pyarrow (no Spark)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(str(Path(output) / "state" / table_dir_name("public", table))).to_pylist()
    return sorted(({"id": r["id"], "v": r["v"]} for r in rows), key=lambda r: r["id"])


def test_materialize_refuses_per_table_and_builds_a_table_captured_only_after_the_gap(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("ALTER PUBLICATION pub_items ADD TABLE other")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 10) g")
    db.execute("INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 10) g")
    assert ingest(db.dsn, *cap.args("--typed-tables")).exit_code == 0
    code, _, err = materialize(cap.output)
    assert code == 0, err
    db.execute("SELECT pg_drop_replication_slot(%s)", (cap.slot,))  # the gap
    db.execute("UPDATE items SET v = 'gap' WHERE id <= 3")
    db.execute("UPDATE other SET v = 'gap' WHERE id <= 3")
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (cap.slot,))
    db.execute("ALTER PUBLICATION pub_items DROP TABLE other")  # the resync leaves it out: it stays uncovered
    code, summary, err = _resync(cap)
    assert code == 0 and summary["marked"] is True and summary["snapshot"]["tables"] == 1, err
    db.execute("ALTER PUBLICATION pub_items ADD TABLE other")
    db.execute("CREATE TABLE extra (id int PRIMARY KEY, v text)")  # captured only after the gap: missed nothing
    db.execute("ALTER PUBLICATION pub_items ADD TABLE extra")
    db.execute("INSERT INTO extra VALUES (1, 'e1'), (2, 'e2')")
    db.execute("UPDATE other SET v = 'after' WHERE id = 4")
    assert ingest(db.dsn, *cap.args("--typed-tables")).exit_code == 0

    result = CliRunner().invoke(cli, ["materialize", "--output", cap.output, "--json"])

    assert result.exit_code == 2, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    modes = {t["table"]: t["mode"] for t in lines if "table" in t}
    assert modes == {"public.items": "full", "public.extra": "full", "public.other": "refused"}
    assert lines[-1]["refused"] == ["public.other"] and lines[-1]["built"] == 2 and lines[-1]["status"] == "refused"
    assert "public.other: the output lacks the changes in" in result.stderr
    assert "pgpoll snapshot --tables public.other" in result.stderr
    assert "1 table(s) refused across the gap (public.other); 2 other table(s) built" in result.stderr
    assert _parquet_state(cap.output, "items") == [{"id": i, "v": v} for i, v in cap.source_rows()]
    assert _parquet_state(cap.output, "extra") == [{"id": 1, "v": "e1"}, {"id": 2, "v": "e2"}]
