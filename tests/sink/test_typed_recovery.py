"""--typed-tables through crashes: a typed partition is visible only with its batch's commit record.

After a crash the next run's recovery leaves every typed partition either
recorded (published after its record won the commit log's compare-and-set)
or removed (named by no record and above the high-water mark: the slot still
holds its changes; nothing is ever adopted), and the typed rows then hold
exactly the envelope's changes, once each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pgpoll.faults import FAULT_EXIT
from pgpoll.sink import layout
from tests.ingest.conftest import Capture, ingest, ingest_process, make_capture, read_output

ITEMS = layout.table_dir_name("public", "items")


def _record_files(out: str) -> list[Path]:
    return sorted((Path(out) / layout.COMMITS).glob("*.json"))  # the names sort in record order


def _records(out: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in _record_files(out)]


def _typed_partitions(out: str) -> set[tuple[str, str]]:
    """Every ``(table dir, lsn_range=...)`` directory under ``tables/``, recorded or not."""
    root = Path(out) / layout.TABLES
    if not root.exists():
        return set()
    return {(t.name, p.name) for t in root.iterdir() for p in t.iterdir() if p.name.startswith("lsn_range=")}


def _recorded_partitions(out: str) -> set[tuple[str, str]]:
    return {(t, r["partition"]) for r in _records(out) if r["partition"] for t in r["tables"]}


def _typed_rows(spark: Any, out: str) -> list[dict[str, Any]]:
    frame = spark.read.option("mergeSchema", "true").parquet(str(Path(out) / layout.TABLES / ITEMS))
    return [r.asDict(recursive=True) for r in frame.orderBy("_commit_lsn", "_seq").collect()]


def _assert_typed_equals_envelope(spark: Any, capture: Capture, ids: list[int]) -> None:
    out = capture.output
    # no typed partition is left without its batch's record, and every recorded one exists
    assert _typed_partitions(out) == _recorded_partitions(out)
    envelope = [(r["op"], r["commit_lsn"], r["seq"]) for r in read_output(spark, out) if r["op"] != "M"]
    typed_rows = _typed_rows(spark, out)
    typed = [(r["_op"], r["_commit_lsn"], r["_seq"]) for r in typed_rows]
    assert typed == envelope
    assert len(set(typed)) == len(typed), "duplicate typed rows"
    assert sorted(r["id"] for r in typed_rows if r["_op"] == "I") == ids


def _changes(capture: Capture, first: int, last: int) -> None:
    capture.db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (first, last))
    capture.db.execute("UPDATE items SET v = 'u' WHERE id = %s", (first,))
    capture.db.execute("DELETE FROM items WHERE id = %s", (last,))


def _crash(capture: Capture, point: str) -> None:
    crashed = ingest_process(
        capture.db.dsn, *capture.args("--typed-tables", "--batch-changes", "30"), env={"PGPOLL_FAULT": point}
    )
    assert crashed.exit_code == FAULT_EXIT, (crashed.exit_code, crashed.stderr[-2000:])
    assert f"PGPOLL_FAULT={point}" in crashed.stderr


# after-write: the crash leaves the batch staged only, planned on the head: the rerun's start leaves it alone
# (it could be a live run's), and once the rerun has won a record it is stale and removed. The other two crash
# at after-commit-log (record won, files moved, slot not advanced), check that, then remove the batch's record
# by hand: its partitions are then named by no record and lie above the high-water mark, so they are removed,
# not adopted, and the slot's changes written again; cut-short also lost a typed file first (same outcome).
CASES = [
    ("test_decoding", "after-write"),
    ("pgoutput", "no-record"),
    ("test_decoding", "cut-short"),
]


@pytest.mark.parametrize(("plugin", "case"), CASES)
def test_a_crash_leaves_typed_partitions_recorded_or_removed_and_rows_once(
    db: Any, spark: Any, tmp_path: Path, plugin: str, case: str
) -> None:
    capture = make_capture(db, plugin, tmp_path / "out")
    out = capture.output
    _changes(capture, 1, 40)
    _changes(capture, 41, 60)
    _crash(capture, "after-write" if case == "after-write" else "after-commit-log")

    lost: tuple[str, str] | None = None
    if case == "after-write":
        assert _typed_partitions(out) == set() and not _records(out)
        staged = list((Path(out) / layout.STAGING).iterdir())
        assert any(p.name.endswith("-tables") for p in staged)  # the typed rows were staged, not published
    else:
        assert _typed_partitions(out) == _recorded_partitions(out) != set()
        if case in ("no-record", "cut-short"):
            last = _records(out)[-1]
            lost = (ITEMS, last["partition"])
            _record_files(out)[-1].unlink()
            assert lost in _typed_partitions(out) and lost not in _recorded_partitions(out)
            if case == "cut-short":
                typed_dir = Path(out) / layout.TABLES / ITEMS / last["partition"]
                next(typed_dir.glob("part-*")).unlink()

    _changes(capture, 61, 70)
    rerun = ingest(db.dsn, *capture.args("--typed-tables", "--batch-changes", "30"))
    assert rerun.exit_code == 0, rerun.stderr
    assert rerun.summary is not None
    recovery = rerun.summary["recovery"]
    assert recovery["adopted"] == []
    if case == "after-write":
        assert not recovery["removed_staging"]  # planned on the head: never touched at start
        assert not list((Path(out) / layout.STAGING).iterdir())  # stale once the rerun won: removed
    else:
        assert lost is not None
        assert set(recovery["removed_partitions"]) == {lost[1], f"{layout.TABLES}/{ITEMS}/{lost[1]}"}
    _assert_typed_equals_envelope(spark, capture, list(range(1, 71)))


def test_a_typed_partition_without_a_commit_record_is_removed_by_the_next_run(
    db: Any, spark: Any, tmp_path: Path
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    out = capture.output
    _changes(capture, 1, 10)
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    recorded = _recorded_partitions(out)
    assert recorded and {t for t, _p in recorded} == {ITEMS}
    # left by hand: a typed partition of a table never recorded, and one of a recorded table at an
    # LSN no record names (as a crash between the typed renames and the envelope's would leave)
    existing = next(iter(recorded))[1]
    stray = [
        Path(out) / layout.TABLES / "public.x" / layout.partition_name(0x10, 0x20),
        Path(out) / layout.TABLES / ITEMS / layout.partition_name(0xFFFF0000, 0xFFFF0001),
    ]
    for directory in stray:
        directory.mkdir(parents=True)
        shutil.copy(next((Path(out) / layout.TABLES / ITEMS / existing).glob("part-*")), directory / "part-00000.parquet")
    not_a_partition = Path(out) / layout.TABLES / ITEMS / "notes"
    not_a_partition.mkdir()

    _changes(capture, 11, 20)
    rerun = ingest(db.dsn, *capture.args("--typed-tables"))
    assert rerun.exit_code == 0, rerun.stderr
    assert rerun.summary is not None
    # above the high-water mark: removed (the slot holds those changes); below it: set aside, never deleted
    below, above = stray
    assert rerun.summary["recovery"]["removed_partitions"] == [f"{layout.TABLES}/{above.parent.name}/{above.name}"]
    assert not above.exists() and not below.exists()
    assert (Path(out) / layout.UNRECORDED / layout.TABLES / below.parent.name / below.name / "part-00000.parquet").exists()
    assert not_a_partition.exists()  # recovery removes only partitions
    not_a_partition.rmdir()
    _assert_typed_equals_envelope(spark, capture, list(range(1, 21)))
