"""``pgpoll materialize --format iceberg`` end to end: Iceberg tables in a SQLite catalog equal to the source, one
snapshot per run, time travel, schema evolution (new columns, promotions, a refused type change: exit 5),
idempotent reruns (also after a kill between the data write and the catalog commit), a foreign commit reported
(exit 5), one run per destination (exit 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyiceberg.catalog.sql import SqlCatalog

from pgpoll.cli.main import cli
from pgpoll.faults import FAULT_EXIT
from pgpoll.materialize.delta import files as delta_files
from pgpoll.materialize.dest_lease import LEASE_FILE, DestLease
from pgpoll.materialize.driver import run as driver_run
from pgpoll.materialize.iceberg import state as iceberg_state
from pgpoll.materialize.iceberg import table as iceberg_table
from pgpoll.sink.stores.local import open_local
from tests.ingest.conftest import capture_args, ingest

COLUMNS = ("id", "name", "n", "at")
REPO = Path(__file__).resolve().parents[2]


def _run(out: str, *args: str) -> tuple[int, list[dict[str, Any]], dict[str, Any], str]:
    """``pgpoll materialize --json --format iceberg``: exit code, per-table lines, the summary line, stderr."""
    result = CliRunner().invoke(cli, ["materialize", "--output", out, "--json", "--format", "iceberg", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines and "table" not in lines[-1], result.stdout + result.stderr  # the summary comes last
    return result.exit_code, lines[:-1], lines[-1], result.stderr


def _process(out: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``pgpoll materialize --format iceberg`` in its own process (a crash point kills it for real)."""
    return subprocess.run([sys.executable, "-m", "pgpoll", "materialize", "--output", out, "--format", "iceberg", "--json",
                           *args], capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO, timeout=300)


def catalog(dest: Path) -> SqlCatalog:
    """The default catalog of a local DEST, opened the way any pyiceberg user would."""
    return SqlCatalog("pgpoll", uri=f"sqlite:///{dest}/_catalog.db", warehouse=f"file://{dest}")


def _setup(db: Any, tmp_path: Path) -> tuple[list[str], str, Path]:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text, n numeric(10,2), at timestamptz)")
    args = ["--slot", capture_args(db, "test_decoding", "t")[1], "--typed-tables"]
    out = str(tmp_path / "out")
    return [*args, "--output", out], out, Path(out) / "state"


def _source(db: Any, columns: tuple[str, ...] = COLUMNS) -> list[dict[str, Any]]:
    return [dict(zip(columns, r, strict=True)) for r in db.execute(f"SELECT {', '.join(columns)} FROM t ORDER BY id")]


def _iceberg(dest: Path, snapshot: int | None = None, columns: tuple[str, ...] = COLUMNS) -> list[dict[str, Any]]:
    """The table read back through the catalog with pyiceberg (user columns only)."""
    table = catalog(dest).load_table(("public", "t"))
    rows = table.scan(snapshot_id=snapshot, selected_fields=columns).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _snapshots(dest: Path) -> list[Any]:
    return list(catalog(dest).load_table(("public", "t")).snapshots())


def test_each_run_is_one_iceberg_snapshot_equal_to_the_source(db: Any, spark: Any, tmp_path: Path) -> None:
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1.50, '2024-06-01 12:00:00.123456+02'), (2, 'b', NULL, NULL), (3, 'c', 3, now())")
    db.execute("UPDATE t SET name = 'a2' WHERE id = 1")
    db.execute("DELETE FROM t WHERE id = 3")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, summary, err = _run(out)
    assert code == 0, err
    assert [(t["table"], t["format"], t["mode"], t["rows"]) for t in tables] == [("public.t", "iceberg", "full", 2)]
    assert summary["status"] == "ok" and summary["format"] == "iceberg"
    first = _source(db)
    assert _iceberg(dest) == first and first[0]["n"] == Decimal("1.50")
    assert not (dest / LEASE_FILE).exists()
    (s0,) = _snapshots(dest)
    assert tables[0]["iceberg_snapshot"] == s0.snapshot_id and s0.summary["pgpoll.position"] == tables[0]["position"]
    table = catalog(dest).load_table(("public", "t"))
    assert {f.name: str(f.field_type) for f in table.schema().fields} == {
        "id": "int", "name": "string", "n": "decimal(10, 2)", "at": "timestamptz", "_untyped": "map<string, string>",
        "_commit_lsn": "long", "_commit_ts": "timestamptz"}
    assert table.location() == f"file://{dest}/public/t"

    # a rerun with nothing new: no commit
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["mode"] == "unchanged" and tables[0]["iceberg_snapshot"] == s0.snapshot_id, err
    assert len(_snapshots(dest)) == 1

    # an incremental run: one new snapshot, ADD COLUMN and a promotion (int -> bigint) in the schema; the first
    # snapshot stays readable (time travel)
    db.execute("UPDATE t SET id = 20, n = 7.25 WHERE id = 2")
    db.execute("INSERT INTO t VALUES (4, 'd', 4, NULL)")
    db.execute("ALTER TABLE t ADD COLUMN extra text")
    db.execute("ALTER TABLE t ALTER COLUMN id TYPE bigint, ALTER COLUMN n TYPE numeric(14,2)")
    db.execute("INSERT INTO t VALUES (5, 'e', 5, NULL, 'x')")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["mode"] == "incremental", err
    snapshots = _snapshots(dest)
    assert len(snapshots) == 2 and snapshots[1].parent_snapshot_id == s0.snapshot_id
    assert snapshots[1].summary.operation.value == "overwrite"
    assert _iceberg(dest, columns=(*COLUMNS, "extra")) == _source(db, (*COLUMNS, "extra"))
    assert _iceberg(dest, snapshot=s0.snapshot_id) == first
    types = {f.name: str(f.field_type) for f in catalog(dest).load_table(("public", "t")).schema().fields}
    assert (types["id"], types["n"], types["extra"]) == ("long", "decimal(14, 2)", "string")

    # --full rebuilds on top of the current snapshot (a new one), same content and position
    position = tables[0]["position"]
    code, tables, _, err = _run(out, "--full")
    assert code == 0 and tables[0]["mode"] == "full" and tables[0]["position"] == position, err
    assert len(_snapshots(dest)) == 3 and _iceberg(dest, columns=(*COLUMNS, "extra")) == _source(db, (*COLUMNS, "extra"))

    # a type change Iceberg cannot promote: exit 5 naming the column and the fix, nothing committed
    db.execute("ALTER TABLE t ALTER COLUMN n TYPE text USING n::text || '!'")
    db.execute("INSERT INTO t VALUES (6, 'f', 'x', NULL, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, summary, err = _run(out)
    assert code == 5 and summary["status"] == "error", err
    assert "n decimal(14, 2) -> string" in err and "drop_table" in err and "--full" in err
    assert len(_snapshots(dest)) == 3


def test_a_foreign_commit_between_read_and_commit_is_reported_with_exit_5(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    assert _run(out)[0] == 0
    db.execute("INSERT INTO t VALUES (2, 'b', 2, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    data = dest / "public" / "t" / "data"
    files = set(data.iterdir())

    real_commit = iceberg_state.IcebergStateTable.commit

    def foreign_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        table = catalog(dest).load_table(("public", "t"))  # another writer appends a copy of a row
        table.append(table.scan(limit=1).to_arrow())
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(iceberg_state.IcebergStateTable, "commit", foreign_first)
    code, _, summary, err = _run(out)
    assert code == 5 and summary["exit_code"] == 5, err
    foreign = catalog(dest).load_table(("public", "t")).current_snapshot()
    assert f"snapshot {foreign.snapshot_id} was committed by another writer (append)" in err and "not committed over it" in err
    assert len(_snapshots(dest)) == 2  # the foreign snapshot, not merged over
    assert set(data.iterdir()) - files == {Path(f.file.file_path[len("file://"):]) for f in catalog(dest).load_table(
        ("public", "t")).scan().plan_files()} - files  # the failed run's files are gone: only the foreign one is new

    monkeypatch.setattr(iceberg_state.IcebergStateTable, "commit", real_commit)
    code, tables, _, err = _run(out)  # the next run builds on the newest snapshot (and keeps the foreign row)
    assert code == 0 and tables[0]["mode"] == "incremental", err
    assert [r["id"] for r in _iceberg(dest)] == [1, 1, 2]


def test_a_second_materialize_on_the_same_dest_exits_3(db: Any, spark: Any, tmp_path: Path) -> None:
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    with DestLease(open_local(str(dest)), run="running", enabled=True):
        code, tables, summary, err = _run(out)
        assert code == 3 and tables == [] and summary["status"] == "busy", err
    assert not (dest / "public").exists()  # it changed nothing
    code, _, _, err = _run(out)
    assert code == 0 and _iceberg(dest) == _source(db), err


def test_a_run_killed_around_its_catalog_commit_is_repaired_by_the_next_run(db: Any, spark: Any, tmp_path: Path) -> None:
    """A real kill (PGPOLL_FAULT, exit 137) after the data files are written, before the catalog commit: the rerun
    commits exactly one snapshot for the position; right after the commit: the rerun commits nothing."""
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL), (2, 'b', 2, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    assert _run(out)[0] == 0
    for n, point in enumerate(["materialize-before-commit", "materialize-after-commit"]):
        db.execute(f"UPDATE t SET name = 'b{n}' WHERE id = 2")
        db.execute(f"INSERT INTO t VALUES ({n + 3}, 'c', 3, NULL)")
        assert ingest(db.dsn, *ingest_args).exit_code == 0
        before = len(_snapshots(dest))
        crashed = _process(out, {"PGPOLL_FAULT": point})
        assert crashed.returncode == FAULT_EXIT and f"PGPOLL_FAULT={point}" in crashed.stderr, crashed.stderr[-3000:]
        landed = point == "materialize-after-commit"
        assert len(_snapshots(dest)) == before + landed
        (dest / LEASE_FILE).write_text(json.dumps({"run": "killed", "expires_at": 0}))  # (expired: as after 60 s)
        code, tables, _, err = _run(out)
        assert code == 0 and tables[0]["mode"] == ("unchanged" if landed else "incremental"), err
        snapshots = _snapshots(dest)
        assert len(snapshots) == before + 1 and len({s.summary["pgpoll.position"] for s in snapshots}) == len(snapshots)
        assert _iceberg(dest) == _source(db)


@pytest.mark.parametrize("engine", ["driver", "spark"])
def test_an_incremental_run_rewrites_only_the_files_holding_changed_keys(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """A state too large for the driver to read whole (here: over 500 rows): the driver (or Spark's join of the
    touched keys with the files' key ranges) reads and rewrites only the files whose key range holds a touched key;
    the others stay in the new snapshot. A TRUNCATE then rewrites every file."""
    monkeypatch.setattr(delta_files, "TARGET_ROWS", 100)  # files of 100 rows: 1,000 rows make ten
    monkeypatch.setattr(driver_run, "DRIVER_ROWS", 5000)
    monkeypatch.setattr(iceberg_state, "DRIVER_ROWS", 500)
    if engine == "spark":
        monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", "spark")
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t SELECT i, 'r' || i, i, NULL FROM generate_series(1, 1000) i")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["files"] == {"rewritten": 0, "added": 10, "kept": 0}, err

    def ranges() -> dict[str, tuple[int, int]]:
        table = catalog(dest).load_table(("public", "t"))
        field = table.schema().find_field("id").field_id
        return {t.file.file_path: (int.from_bytes(t.file.lower_bounds[field], "little", signed=True),
                                   int.from_bytes(t.file.upper_bounds[field], "little", signed=True))
                for t in table.scan().plan_files()}

    first = ranges()
    assert sorted(first.values())[0] == (1, 100) and sorted(first.values())[-1] == (901, 1000)
    db.execute("INSERT INTO t SELECT i, 'new', i, NULL FROM generate_series(1001, 1050) i")
    db.execute("UPDATE t SET name = 'upd' WHERE id BETWEEN 955 AND 1000")
    db.execute("DELETE FROM t WHERE id = 990")
    db.execute("UPDATE t SET id = 5000 WHERE id = 250")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["mode"] == "incremental" and tables[0]["engine"] == engine, err
    assert tables[0]["files"]["rewritten"] == 2 and tables[0]["files"]["kept"] == 8, tables[0]
    second = ranges()
    holding = {p for p, (lo, hi) in first.items() if lo <= 250 <= hi or lo <= 955 <= hi}
    assert {p: r for p, r in second.items() if p in first} == {p: r for p, r in first.items() if p not in holding}
    assert _iceberg(dest) == _source(db) and tables[0]["rows"] == 1049
    assert len(_snapshots(dest)) == 2

    db.execute("TRUNCATE t")
    db.execute("INSERT INTO t VALUES (7, 'after', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    code, tables, _, err = _run(out)
    assert code == 0 and tables[0]["files"] == {"rewritten": len(second), "added": 1, "kept": 0}, err
    assert _iceberg(dest) == _source(db) == [{"id": 7, "name": "after", "n": Decimal("1.00"), "at": None}]


def _together(spark: Any, out: str, n: int = 2) -> list[int]:
    """``n`` materialize runs started together in threads (on the shared SparkSession): their exit codes, sorted."""
    import threading

    from pgpoll.cli.exitcodes import exit_code_for
    from pgpoll.materialize.iceberg.state import IcebergMaterializer
    from pgpoll.materialize.run import MaterializeOptions, run_materialize

    start = threading.Barrier(n)
    codes: list[int] = []

    def one() -> None:
        start.wait(timeout=60)
        try:
            run_materialize(MaterializeOptions(output=out), spark, materializer=IcebergMaterializer)
            codes.append(0)
        except Exception as error:
            codes.append(exit_code_for(error))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return sorted(codes)


@pytest.mark.parametrize("lease", ["on", "off"])
def test_two_runs_together_commit_at_most_one_snapshot(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lease: str
) -> None:
    """With the lease: [0, 3] (or [0, 0] when the second starts after the first finished). Without it (a run that
    outlived its lease), both compute the state and meet at the commit: the catalog takes one, the other exits 5."""
    ingest_args, out, dest = _setup(db, tmp_path)
    db.execute("INSERT INTO t VALUES (1, 'a', 1, NULL)")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    assert _run(out)[0] == 0
    db.execute("INSERT INTO t VALUES (2, 'b', 2, NULL)")
    db.execute("UPDATE t SET name = 'a2' WHERE id = 1")
    assert ingest(db.dsn, *ingest_args).exit_code == 0
    if lease == "off":
        import threading

        monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")
        both = threading.Barrier(2)

        def meet_before_commit(point: str, configured: str | None = None) -> None:
            if point == "materialize-before-commit":
                both.wait(timeout=120)  # both runs passed the snapshot check and wrote their files: the catalog decides

        monkeypatch.setattr(iceberg_table.faults, "crash_if", meet_before_commit)
    codes = _together(spark, out)
    assert codes in ([0, 3], [0, 0]) if lease == "on" else codes == [0, 5], codes
    assert len(_snapshots(dest)) == 2 and _iceberg(dest) == _source(db)
    files = {Path(t.file.file_path[len("file://"):]) for t in catalog(dest).load_table(("public", "t")).scan().plan_files()}
    first_run = {p for p in (dest / "public" / "t" / "data").iterdir()} - files
    assert len(first_run) == 1  # the first snapshot's file; the losing run's files were removed
