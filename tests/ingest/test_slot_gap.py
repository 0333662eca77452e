"""The gap check: a slot moved past the output by anything but pgpoll stops ``ingest`` (exit 4), nothing written.

A recreated slot, a slot consumed by another reader and a slot advanced by
hand each leave changes the output never got; ``ingest`` must refuse before it
reads, ``check --slot --output`` must say the same, and a healthy output's
runs must never see a gap (every other ingest test runs the check too; the
racing runs of ``tests/ingest/test_fencing.py`` check it under concurrency).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli import exitcodes
from pgpoll.cli.main import cli
from pgpoll.errors import SlotGapError
from pgpoll.ingest.run import IngestOptions, RunSummary, run_ingest
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.filesystem import open_output
from tests.cli.conftest import CLEAN_ENV, Pgpoll
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, make_capture


@pytest.fixture
def pgpoll() -> Pgpoll:
    """The CLI in-process, as ``tests/cli/conftest.py``'s fixture of the same name."""
    runner = CliRunner()
    return lambda *args, env=None: runner.invoke(cli, list(args), env={**CLEAN_ENV, **(env or {})},
                                                 catch_exceptions=False)


def _load(db: Any, first: int, count: int) -> None:
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (first, first + count - 1))


def _files(output: str) -> set[str]:
    """Every file under the output but the lease (taken and released by a refused run too) and the run history
    (a refused run is recorded there, as every failed run: pgpoll.observe.run_history)."""
    root = Path(output)
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and "lease" not in p.name and not str(p.relative_to(root)).startswith("_pgpoll/runs")}


def _recreate(cap: Capture) -> None:
    cap.db.execute("SELECT pg_drop_replication_slot(%s)", (cap.slot,))
    _load(cap.db, 100, 5)  # written while no slot existed: never decoded by anyone
    cap.db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (cap.slot, cap.plugin))


def _consume(cap: Capture) -> None:
    if cap.plugin == "pgoutput":
        cap.db.execute("SELECT count(*) FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                       "'publication_names', 'pub_items')", (cap.slot,))
    else:
        cap.db.execute("SELECT count(*) FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (cap.slot,))


def _advance(cap: Capture) -> None:
    cap.db.execute("SELECT 1 FROM pg_replication_slot_advance(%s, pg_current_wal_lsn())", (cap.slot,))


@pytest.mark.parametrize("move", [_recreate, _consume, _advance], ids=["recreated", "consumed", "advanced"])
def test_a_slot_moved_past_the_output_stops_ingest_with_nothing_written(
    capture: Capture, move: Callable[[Capture], None], pgpoll: Any,
) -> None:
    db = capture.db
    _load(db, 1, 10)
    first = ingest(db.dsn, *capture.args())
    assert first.exit_code == 0 and first.summary is not None and first.summary["changes"] == 10, first.stderr
    hwm = first.summary["last_lsn"]
    _load(db, 20, 10)
    move(capture)
    _load(db, 40, 3)
    before_files, slot_before = _files(capture.output), confirmed_lsn(db, capture.slot)

    refused = ingest(db.dsn, *capture.args())

    assert refused.exit_code == exitcodes.SOURCE == 4, refused.stderr
    assert _files(capture.output) == before_files  # nothing written
    assert confirmed_lsn(db, capture.slot) == slot_before  # the slot not moved
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    message = next(line for line in lines if "past the output's high-water mark" in line)
    assert f'slot "{capture.slot}" is at {slot_before}, past the output\'s high-water mark {hwm}' in message
    assert "dropped and recreated, consumed by another reader, or advanced by hand" in message
    assert any("fix: run `pgpoll resync" in line and "lost-slot.md" in line for line in lines)
    assert "Traceback" not in refused.stderr and db.server.password not in refused.stdout + refused.stderr

    checked = pgpoll("check", "--slot", capture.slot, "--output", capture.output, "--json", env={"PGPOLL_DSN": db.dsn})
    assert checked.exit_code == 4, checked.output
    item = next(json.loads(r) for r in checked.stdout.splitlines() if '"slot_vs_output"' in r)
    assert item["status"] == "fail" and item["value"].startswith("slot_ahead_of_output") and "resync" in item["fix"]


def test_a_healthy_output_passes_the_check_and_records_the_server(capture: Capture, pgpoll: Any) -> None:
    db = capture.db
    for round_no in range(3):  # idle runs (heartbeat batches) between loaded ones: never a gap
        if round_no != 1:
            _load(db, round_no * 10, 5)
        run = ingest(db.dsn, *capture.args())
        assert run.exit_code == 0, run.stderr
    records = CommitLog(open_output(capture.output)).records()
    sysid = db.execute("SELECT system_identifier::text FROM pg_control_system()")[0][0]
    assert records and all(r.server == {"system_identifier": sysid, "timeline": 1} for r in records)
    checked = pgpoll("check", "--slot", capture.slot, "--output", capture.output, "--json", env={"PGPOLL_DSN": db.dsn})
    item = next(json.loads(r) for r in checked.stdout.splitlines() if '"slot_vs_output"' in r)
    assert checked.exit_code == 0 and item["status"] == "ok" and item["value"].startswith("in_sync"), checked.output


def test_check_with_output_needs_slot(pgpoll: Any, db: Any, tmp_path: Path) -> None:
    result = pgpoll("check", "--output", str(tmp_path / "out"), env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == exitcodes.USAGE and "--output needs --slot" in result.output


def test_a_slot_moved_during_a_run_stops_it_and_the_next_one(db: Any, tmp_path: Path) -> None:
    """The reviewer's reproduction: after batch 1, a row, the slot consumed by another reader, another row."""
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    for row in range(1, 13):  # one transaction each: two batches of 6 rows if nothing moved the slot
        _load(db, row, 1)

    def move(summary: RunSummary) -> None:
        if summary.batches == 1:
            _load(db, 100, 1)
            _consume(cap)  # changes 7..12 and 100 are gone from the slot
            _load(db, 200, 1)

    opts = IngestOptions(slot=cap.slot, output=cap.output, batch_changes=6, dsn=db.dsn)
    with pytest.raises(SlotGapError) as raised:
        run_ingest(opts, on_batch=move)

    records = CommitLog(open_output(cap.output)).records()
    assert [r.rows for r in records] == [2]  # batch 1 (6 peeked rows: BEGIN, INSERT, COMMIT twice) stays; nothing after
    assert f'slot "{cap.slot}" is at {confirmed_lsn(db, cap.slot)}, past the output\'s high-water mark ' \
           f"{records[0].end}" in raised.value.message
    assert raised.value.hint is not None and "pgpoll resync" in raised.value.hint
    assert "earlier batches stay committed" in raised.value.hint
    again = ingest(db.dsn, *cap.args())
    assert again.exit_code == exitcodes.SOURCE, again.stderr  # and the next run refuses too, naming the same gap
    assert "past the output's high-water mark" in again.stderr
