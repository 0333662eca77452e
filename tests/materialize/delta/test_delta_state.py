"""``pgpoll materialize --format delta`` end to end: Delta tables equal to the source, one version per run,
idempotent reruns, conflicts reported (exit 5), one run per destination (exit 3)."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.materialize.delta import files as delta_files
from pgpoll.materialize.delta import state as delta_state
from pgpoll.materialize.delta.table import DeltaStateTable
from pgpoll.materialize.dest_lease import LEASE_FILE, DestLease
from pgpoll.materialize.driver import run as driver_run
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.stores.local import open_local
from tests.ingest.conftest import capture_args, ingest

COLUMNS = ("id", "name", "n", "at")


def _run(out: str, *args: str) -> tuple[int, list[dict[str, Any]], dict[str, Any], str]:
    """``pgpoll materialize --json --format delta``: exit code, per-table lines, the summary line, stderr."""
    result = CliRunner().invoke(cli, ["materialize", "--output", out, "--json", "--format", "delta", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines and "table" not in lines[-1], result.stdout  # the summary comes last
    return result.exit_code, lines[:-1], lines[-1], result.stderr


def _setup(db: Any, tmp_path: Path) -> tuple[list[str], str, Path]:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text, n numeric(10,2), at timestamptz)")
    args = ["--slot", capture_args(db, "test_decoding", "t")[1], "--typed-tables"]
    out = str(tmp_path / "out")
    return [*args, "--output", out], out, Path(out) / "state" / "public.t"


def _source(db: Any) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in db.execute(f"SELECT {', '.join(COLUMNS)} FROM t ORDER BY id")]


def _delta(path: Path, version: int | None = None) -> list[dict[str, Any]]:
    """The table read back with deltalake (user columns only)."""
    rows = read_delta(str(path), version).select(list(COLUMNS)).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_each_run_is_one_delta_version_equal_to_the_source(db: Any, spark: Any, tmp_path: Path) -> None:
    ingest_args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1.50, '2024-06-01 12:00:00.123456+02'), (2, 'b', NULL, NULL), (3, 'c', 3, now())")
    db.execute("UPDATE t SET name = 'a2' WHERE id = 1")
    db.execute("DELETE FROM t WHERE id = 3")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, summary, err = _run(out)
    assert code == 0, err
    assert [(t["table"], t["format"], t["version"], t["mode"], t["rows"]) for t in tables] == [
        ("public.t", "delta", 0, "full", 2)]
    assert summary["status"] == "ok" and summary["exit_code"] == 0 and summary["format"] == "delta"
    assert (summary["tables"], summary["rows"]) == (1, 2) and summary["seconds"] > 0
    first = _source(db)
    assert _delta(table) == first and first[0]["n"] == Decimal("1.50")
    assert not (Path(out) / "state" / LEASE_FILE).exists()

    # a rerun with nothing new: no commit, same version
    code, tables, _, err = _run(out)
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("unchanged", 0), err
    assert DeltaTable(str(table)).version() == 0

    # an incremental run: one new version, ADD COLUMN in the Delta schema; the first version stays readable
    db.execute("UPDATE t SET id = 20, n = 7.25 WHERE id = 2")
    db.execute("INSERT INTO t VALUES (4, 'd', 4, NULL)")
    db.execute("ALTER TABLE t ADD COLUMN extra text")
    db.execute("INSERT INTO t VALUES (5, 'e', 5, NULL, 'x')")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("incremental", 1), err
    assert _delta(table) == _source(db) and _delta(table, 0) == first
    read = read_delta(str(table))
    extra = dict(zip(read.column("id").to_pylist(), read.column("extra").to_pylist(), strict=True))
    assert extra[5] == "x" and extra[1] is None
    assert _delta(table) == _source(db)
    position = tables[0]["position"]

    # --full rebuilds on top of the current version (a new one), same content and position
    code, tables, _, err = _run(out, "--full")
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("full", 2), err
    assert _delta(table) == _source(db) and tables[0]["position"] == position
    history = DeltaTable(str(table)).history()
    assert [h["version"] for h in history] == [2, 1, 0]
    assert json.loads(history[0]["pgpoll"])["position"] == tables[0]["position"]

    # the other format on a Delta table is refused (exit 2), nothing changed
    result = CliRunner().invoke(cli, ["materialize", "--output", out])
    assert result.exit_code == 2 and "is a Delta table" in result.stderr
    assert DeltaTable(str(table)).version() == 2

    # a name written with %XX in its directory: delta-rs cannot open such a location, so it is refused up front
    db.execute('CREATE TABLE "odd name" (id int PRIMARY KEY)')
    db.execute('INSERT INTO "odd name" VALUES (1)')
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, summary, err = _run(out)
    assert code == 2 and tables == [] and "public.odd%20name" in err and "--exclude-tables" in err, err
    assert not (Path(out) / "state" / "public.odd%20name").exists()
    code, tables, _, err = _run(out, "--exclude-tables", "public.odd name")
    assert code == 0 and [(t["table"], t["mode"]) for t in tables] == [("public.t", "unchanged")], err


def test_a_foreign_commit_between_read_and_commit_is_reported_with_exit_5(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    assert _run(out)[0] == 0
    db.execute("INSERT INTO t VALUES (2, 'b', 2, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    run_dirs = {p.name for p in table.iterdir()}

    real_commit = DeltaStateTable.commit

    def foreign_first(self: DeltaStateTable, *args: Any, **kwargs: Any) -> int | None:
        DeltaTable(self.uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(DeltaStateTable, "commit", foreign_first)
    code, _, summary, err = _run(out)
    assert code == 5 and (summary["status"], summary["exit_code"]) == ("error", 5), err
    assert "version 1 was written by delta-rs" in err and "SET TBLPROPERTIES" in err and "after this run read version 0" in err
    assert DeltaTable(str(table)).version() == 1  # the foreign version, not merged over
    assert {p.name for p in table.iterdir()} == run_dirs  # the failed run's files are gone

    monkeypatch.setattr(DeltaStateTable, "commit", real_commit)
    code, tables, _, err = _run(out)  # the next run builds on the newest version
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("incremental", 2), err
    assert _delta(table) == _source(db)


def test_a_second_materialize_on_the_same_dest_exits_3_and_a_stale_lease_blocks_nobody(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL), (2, NULL, 2, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    dest = open_local(str(Path(out) / "state"))
    with DestLease(dest, run="running", enabled=True):  # a materialize of DEST is under way
        started = time.monotonic()
        code, tables, summary, err = _run(out)
        assert code == 3 and tables == [] and (summary["status"], summary["exit_code"]) == ("busy", 3), err
        assert "another pgpoll materialize (run running)" in err and time.monotonic() - started < 30
        assert not table.exists()  # it changed nothing
    # a run killed with SIGKILL leaves its lease behind; once expired it does not block the next run
    (Path(out) / "state" / LEASE_FILE).write_text(json.dumps({"run": "killed", "expires_at": time.time() - 1}))
    monkeypatch.setattr(delta_state, "local_path", lambda path: None)  # file statistics as for remote stores: with Spark
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", "spark")  # (the state too: a remote DEST is never computed in the driver)
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["version"] == 0, err
    assert _delta(table) == _source(db)
    stats = [json.loads(line["add"]["stats"]) for line in map(json.loads, (
        table / "_delta_log" / "00000000000000000000.json").read_text().splitlines()) if "add" in line]
    assert sum(s["numRecords"] for s in stats) == 2
    assert sorted((s["minValues"]["id"], s["maxValues"]["id"], s["nullCount"]["id"]) for s in stats if s["numRecords"]) in (
        [(1, 1, 0), (2, 2, 0)], [(1, 2, 0)])


class _Killed(BaseException):
    """Stands for the process dying at that point (nothing after it runs in the run)."""


def test_a_run_killed_before_or_after_its_commit_is_repaired_by_the_next_run(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL), (2, 'b', 2, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    real_commit = DeltaStateTable.commit

    def killed_before(self: DeltaStateTable, *args: Any, **kwargs: Any) -> int | None:
        raise _Killed

    # killed after Spark wrote the files, before the commit (SIGKILL: no clean-up runs)
    monkeypatch.setattr(DeltaStateTable, "commit", killed_before)
    monkeypatch.setattr(delta_state.DeltaMaterializer, "_discard", lambda *args: None)
    with pytest.raises(_Killed):
        CliRunner().invoke(cli, ["materialize", "--output", out, "--format", "delta"], catch_exceptions=False)
    orphans = {p.name for p in table.iterdir()}
    assert not (table / "_delta_log").exists() and len(orphans) == 1  # files in no version: no table yet
    monkeypatch.undo()
    code, tables, _, err = _run(out)
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("full", 0), err
    assert _delta(table) == _source(db)
    assert not any(f.split("/")[-2] in orphans for f in DeltaTable(str(table)).file_uris())  # readers never see them

    # killed right after the commit landed: the next run finds the position applied and commits nothing
    db.execute("UPDATE t SET name = 'b2' WHERE id = 2")
    assert ingest(db.dsn, *ingest_args).exit_code == 0

    def killed_after(self: DeltaStateTable, *args: Any, **kwargs: Any) -> int | None:
        real_commit(self, *args, **kwargs)
        raise _Killed

    monkeypatch.setattr(DeltaStateTable, "commit", killed_after)
    with pytest.raises(_Killed):
        CliRunner().invoke(cli, ["materialize", "--output", out, "--format", "delta"], catch_exceptions=False)
    monkeypatch.undo()
    assert DeltaTable(str(table)).version() == 1 and _delta(table) == _source(db)  # its files were kept
    code, tables, _, err = _run(out)
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("unchanged", 1), err
    assert DeltaTable(str(table)).version() == 1 and _delta(table) == _source(db)


def _log(table: Path, version: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


def _ranges(table: Path, version: int) -> dict[str, tuple[int, int]]:
    """The data files of a version with the [min, max] of ``id`` its log holds."""
    adds = DeltaTable(str(table), version=version).get_add_actions(flatten=True)
    return {p: (lo, hi) for p, lo, hi in zip(*(adds.column(c).to_pylist() for c in ("path", "min.id", "max.id")), strict=True)}


@pytest.mark.parametrize("case", ["spark", "driver", "driver bound"])
def test_an_incremental_run_rewrites_only_the_files_holding_changed_keys(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """With Spark, and in the driver: few changes on a state too large to hold whole (here: over 500 rows);
    files to rewrite over the driver's bound (here: 1 byte) go to Spark."""
    monkeypatch.setattr(delta_files, "TARGET_ROWS", 100)  # files of 100 rows: 1,000 rows make ten
    engine = "driver" if case == "driver" else "spark"
    if case == "spark":
        monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", "spark")
    else:  # the first build (1,000 changes) goes to Spark; the incremental run's 98 changes to the driver
        monkeypatch.setattr(driver_run, "DRIVER_ROWS", 500)
        monkeypatch.setattr(delta_state, "DRIVER_ROWS", 500)
        if case == "driver bound":
            monkeypatch.setattr(delta_state, "DRIVER_AFFECTED_BYTES", 1)
    ingest_args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t SELECT i, 'r' || i, i, NULL FROM generate_series(1, 1000) i")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["files"] == {"rewritten": 0, "added": 10, "kept": 0}, err
    first = _ranges(table, 0)
    spans = sorted(first.values())
    assert all(hi - lo == 99 for lo, hi in spans) and spans[0][0] == 1 and spans[-1][1] == 1000  # contiguous key ranges

    # append new keys, update the most recent ones, move one old key to a new one
    db.execute("INSERT INTO t SELECT i, 'new', i, NULL FROM generate_series(1001, 1050) i")
    db.execute("UPDATE t SET name = 'upd', n = n + 0.5 WHERE id BETWEEN 955 AND 1000")
    db.execute("DELETE FROM t WHERE id = 990")
    db.execute("UPDATE t SET id = 5000 WHERE id = 250")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    changed = [*range(955, 1001), 250, 5000, *range(1001, 1051)]
    holding = {p for p, (lo, hi) in first.items() if any(lo <= k <= hi for k in changed)}
    assert len(holding) == 2  # the files of 201-300 and 901-1000
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("incremental", 1), err
    assert tables[0]["files"]["rewritten"] == 2 and tables[0]["files"]["kept"] == 8, tables[0]
    assert tables[0]["engine"] == engine
    assert {a["remove"]["path"] for a in _log(table, 1) if "remove" in a} == holding
    second = _ranges(table, 1)
    assert {p: r for p, r in second.items() if p in first} == {p: r for p, r in first.items() if p not in holding}
    assert len(second) == 8 + tables[0]["files"]["added"]
    assert _delta(table) == _source(db) and tables[0]["rows"] == len(_source(db)) == 1049

    # a TRUNCATE empties the table as of its position: every file is rewritten
    db.execute("TRUNCATE t")
    db.execute("INSERT INTO t VALUES (7, 'after', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["files"] == {"rewritten": len(second), "added": 1, "kept": 0}, err
    assert not any("add" in a for a in _log(table, 2) if "add" in a and a["add"]["path"] in second)
    assert _delta(table) == _source(db) == [{"id": 7, "name": "after", "n": Decimal("1.00"), "at": None}]


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_a_type_change_reaches_the_delta_schema_and_older_rows_are_cast_by_spark(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", engine)
    args, out, table = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1.50, NULL), (2, 'b', 2.25, NULL)")
    assert ingest(db.dsn, *args).exit_code == 0
    code, tables, _summary, err = _run(out)
    assert code == 0 and tables[0]["version"] == 0, err
    assert {f.name: f.type.type for f in DeltaTable(str(table)).schema().fields}["n"] == "decimal(10,2)"
    # PostgreSQL rewrites the rows with the USING expression and sends no change for them
    db.execute("ALTER TABLE t ALTER COLUMN n TYPE text USING n::text || '!'")
    db.execute("INSERT INTO t VALUES (3, 'c', 'x', NULL)")
    db.execute("UPDATE t SET name = 'b2' WHERE id = 2")
    assert ingest(db.dsn, *args).exit_code == 0
    code, tables, _summary, err = _run(out)
    assert code == 0 and (tables[0]["mode"], tables[0]["version"]) == ("incremental", 1), err
    assert tables[0]["engine"] == "spark"  # rows stored under the older type are cast by Spark's rules
    assert {f.name: f.type.type for f in DeltaTable(str(table)).schema().fields}["n"] == "string"
    rows = {r["id"]: (r["name"], r["n"]) for r in _delta(table)}
    assert rows == {1: ("a", "1.50"), 2: ("b2", "2.25!"), 3: ("c", "x")}  # row 1 last changed before the change
    assert _delta(table, version=0)[0]["n"] == Decimal("1.50")  # the version before keeps the old type
