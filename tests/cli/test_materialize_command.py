"""``pgpoll materialize`` in-process: its errors and exit codes, table selection and --to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgpoll.cli import exitcodes
from pgpoll.sink import layout
from tests.cli.conftest import Pgpoll
from tests.ingest.conftest import ingest, make_capture


def _message(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("where", ["empty", "missing"])
def test_an_output_without_a_commit_log_exits_5_with_the_fix(pgpoll: Pgpoll, spark: Any, tmp_path: Path,
                                                              where: str) -> None:
    out = tmp_path / "out"
    if where == "empty":
        out.mkdir()
    result = pgpoll("materialize", "--output", str(out))
    assert result.exit_code == exitcodes.SINK == 5
    lines = _message(result.stderr)
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: ") and "no commit log" in lines[0] and str(out) in lines[0]
    assert lines[1].startswith("  fix: ") and "pgpoll ingest --typed-tables" in lines[1]
    assert result.stdout == ""
    assert not (out / layout.STATE).exists()


def test_an_output_ingested_without_typed_tables_exits_5_naming_the_flag(
    pgpoll: Pgpoll, db: Any, spark: Any, tmp_path: Path
) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(db.dsn, *capture.args()).exit_code == 0
    result = pgpoll("materialize", "--output", capture.output)
    assert result.exit_code == exitcodes.SINK
    lines = _message(result.stderr)
    assert len(lines) == 2, lines
    assert lines[0] == f"error: {capture.output} has no typed tables"
    assert lines[1].startswith("  fix: ") and "--typed-tables" in lines[1]
    assert not (Path(capture.output) / layout.STATE).exists()


def test_tables_patterns_select_tables_and_to_writes_elsewhere(
    pgpoll: Pgpoll, db: Any, spark: Any, tmp_path: Path
) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")  # test_decoding captures items and other
    db.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    db.execute("INSERT INTO other VALUES (7, 'z')")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    out = Path(capture.output)
    assert {p.name for p in (out / layout.TABLES).iterdir()} == {"public.items", "public.other"}

    selected = pgpoll("materialize", "--output", capture.output, "--tables", "public.it*")
    assert selected.exit_code == 0, selected.stderr
    [line] = selected.stdout.splitlines()
    assert line.startswith("public.items: 2 row(s) as of ") and " (full) -> " in line
    assert line.endswith(f"{layout.STATE}/public.items")
    assert sorted(p.name for p in (out / layout.STATE).iterdir() if not p.name.startswith("_")) == ["public.items"]
    items = spark.read.parquet(str(out / layout.STATE / "public.items"))
    assert sorted((r["id"], r["v"]) for r in items.collect()) == [(1, "a"), (2, "b")]

    dest = tmp_path / "elsewhere"
    moved = pgpoll("materialize", "--output", capture.output, "--to", str(dest), "--exclude-tables", "public.items",
                   "--json")
    assert moved.exit_code == 0, moved.stderr
    assert '"table": "public.other"' in moved.stdout and "public.items" not in moved.stdout
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith((".", "_"))) == ["public.other"]
    other = spark.read.parquet(str(dest / "public.other"))
    assert [(r["id"], r["v"]) for r in other.collect()] == [(7, "z")]
    # --to left the default state untouched
    assert sorted(p.name for p in (out / layout.STATE).iterdir() if not p.name.startswith("_")) == ["public.items"]

    nothing = pgpoll("materialize", "--output", capture.output, "--tables", "nomatch.*")
    assert nothing.exit_code == 0 and nothing.stdout == ""


def test_a_bad_engine_setting_exits_2_before_spark_and_writes_nothing(
    pgpoll: Pgpoll, db: Any, spark: Any, tmp_path: Path
) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    result = pgpoll("materialize", "--output", capture.output, env={"PGPOLL_MATERIALIZE_ENGINE": "gpu"})
    assert result.exit_code == exitcodes.USAGE == 2
    lines = _message(result.stderr)
    assert lines == ["error: PGPOLL_MATERIALIZE_ENGINE='gpu' is not one of auto, spark, driver",
                     "  fix: unset PGPOLL_MATERIALIZE_ENGINE (auto: small tables of a local output in the driver, "
                     "the rest with Spark)"], lines
    assert not (Path(capture.output) / layout.STATE).exists()
    fine = pgpoll("materialize", "--output", capture.output, "--json", env={"PGPOLL_MATERIALIZE_ENGINE": "spark"})
    assert fine.exit_code == 0 and '"engine": "spark"' in fine.stdout, fine.stderr
