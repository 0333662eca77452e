"""``--format delta`` with column names Delta forbids without column mapping: stored as %XX, read back by name.

The key column itself has a space, so the per-file statistics (kept in the log
under the physical name) must map back too for an incremental run to rewrite
only the file holding a changed key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.materialize.delta import files as delta_files
from pgpoll.materialize.delta.names import FORBIDDEN, METADATA_KEY, delta_schema_names, encode, logical_table
from pgpoll.sink.delta_read import read_delta
from tests.ingest.conftest import capture_args, ingest
from tests.materialize.delta.test_mirror import duckdb_delta_rows

COLUMNS = ("the id", "a b", "x,y;z", "f(x)={}", "tab\there", "new\nline", "pct%", "a%20b")
TYPES = ("int PRIMARY KEY", "text", "int", "text", "text", "int", "text", "text")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _run(out: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = CliRunner().invoke(cli, ["materialize", "--output", out, "--json", "--format", "delta", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, [t for t in lines if "table" in t], result.stderr


def _source(db: Any) -> list[dict[str, Any]]:
    rows = db.execute(f"SELECT {', '.join(map(_q, COLUMNS))} FROM t ORDER BY 1")
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


def _delta(table: Path) -> list[dict[str, Any]]:
    read = logical_table(read_delta(str(table))).select(list(COLUMNS))
    return sorted(read.to_pylist(), key=lambda r: r["the id"])


@pytest.mark.parametrize("engine", ["spark", "driver"])
def test_forbidden_column_names_are_stored_as_percent_hex_and_read_back_by_their_names(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setattr(delta_files, "TARGET_ROWS", 10)  # files of 10 rows: 40 rows make four
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", engine)
    db.execute(f"CREATE TABLE t ({', '.join(f'{_q(c)} {t}' for c, t in zip(COLUMNS, TYPES, strict=True))})")
    args = [*capture_args(db, "pgoutput", "t"), "--typed-tables", "--output", str(tmp_path / "out")]
    out, table = str(tmp_path / "out"), tmp_path / "out" / "state" / "public.t"
    db.execute("INSERT INTO t SELECT i, 'ab' || i, i, 'f' || i, 'tab', -i, i || '%', 'lit' FROM generate_series(1, 40) i")
    assert ingest(db.dsn, *args).exit_code == 0
    code, tables, err = _run(out)
    assert code == 0 and tables[0]["files"]["added"] == 4 and tables[0]["engine"] == engine, err

    schema = DeltaTable(str(table)).schema()
    physical = [f.name for f in schema.fields]
    assert physical[:len(COLUMNS)] == [encode(c) for c in COLUMNS]
    assert "a%20b" in physical and "a%2520b" in physical  # "a b" and a real "a%20b" stay apart
    assert not any(ch in FORBIDDEN for name in physical for ch in name)
    assert {f.name: f.metadata.get(METADATA_KEY) for f in schema.fields if f.metadata}.get("f%28x%29%3D%7B%7D") == "f(x)={}"
    assert {v for k, v in delta_schema_names(schema.to_json()).items() if k != v} == set(COLUMNS)
    assert _delta(table) == _source(db)
    duck = sorted(duckdb_delta_rows(table), key=lambda r: r["the%20id"])  # other readers see the physical names
    assert [{c: r[encode(c)] for c in COLUMNS} for r in duck] == _source(db)

    # incremental: the key's statistics, logged under "the%20id", still pick the one file holding the changes (Spark)
    db.execute('UPDATE t SET "a b" = \'changed\', "pct%" = NULL WHERE "the id" IN (35, 36)')
    db.execute('DELETE FROM t WHERE "the id" = 40')
    assert ingest(db.dsn, *args).exit_code == 0
    code, tables, err = _run(out)
    assert code == 0 and tables[0]["mode"] == "incremental", err
    # (a table this small is rewritten whole in the driver)
    assert (tables[0]["files"]["rewritten"], tables[0]["files"]["kept"]) == ((1, 3) if engine == "spark" else (4, 0)), tables[0]
    assert _delta(table) == _source(db) and len(_source(db)) == 39
    assert [f.name for f in DeltaTable(str(table)).schema().fields] == physical
