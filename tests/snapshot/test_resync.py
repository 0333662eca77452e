"""``pgpoll resync`` on the same output: a recreated slot, the gap marked, ingest resumes, every state exact again.

The changes written while the slot was gone (inserts, updates and deletes)
are in no batch; after ``resync`` the materialized state must equal
``SELECT *`` anyway, at the same path, and until the snapshot after the gap
is complete ``materialize`` refuses the table rather than build it without them. Parquet and Delta states.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.reader import gaps
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.snapshot.resync import mark_gap
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.control import ControlConnection
from tests.ingest.conftest import Capture, ingest, make_capture
from tests.materialize.conftest import materialize, state_rows


def _resync(cap: Capture) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(cli, ["resync", "--slot", cap.slot, "--output", cap.output, "--publication", "pub_items",
                                      "--json"], env={"PGPOLL_DSN": cap.db.dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, lines[-1], result.stderr


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

    control = ControlConnection(resolve_dsn(db.dsn), cap.slot)  # the marker alone: as a resync killed after it
    control.open()
    try:
        gap = mark_gap(control, open_output(cap.output), cap.slot, cap.output, "test")
    finally:
        control.close()
    assert gap is not None and gap.kind == "gap" and gap.version == 3
    head = CommitLog(open_output(cap.output)).state()
    assert head.high_water_mark == gap.end_lsn  # the marker does not move the high-water mark

    resumed = ingest(db.dsn, *cap.args("--typed-tables"))  # at once, from the slot's new position
    assert resumed.exit_code == 0 and resumed.summary is not None and resumed.summary["changes"] == 1, resumed.stderr
    code, _, err = materialize(cap.output)
    assert code == 2 and "public.items: the output lacks the changes in" in err and "pgpoll resync" in err, err

    assert gaps(cap.output) == [{"seq": gap.seq, "after": gap.start, "through": gap.resume}]
    listed = CliRunner().invoke(cli, ["batches", "--output", cap.output, "--json"])
    assert [json.loads(line) for line in listed.stdout.splitlines()][-1]["totals"]["gaps"] == 1
    code, summary, err = _resync(cap)  # finds the gap marked, takes the snapshot
    assert code == 0 and summary["marked"] is False and summary["gap"]["seq"] == gap.seq, err
    assert summary["snapshot"]["status"] == "ok" and summary["snapshot"]["tables"] == 1
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
