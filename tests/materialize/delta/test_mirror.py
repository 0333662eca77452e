"""Mirror equality with ``--format delta``: the random workload of test_mirror (every type, TOAST, FULL identity,
truncates, an ADD COLUMN mid-stream) over several ingest runs; after each incremental materialize every Delta
table's current version equals the source value for value, and deltalake reads the same rows.

DuckDB's delta extension (pinned to DuckDB's own version in the test extra) reads every current version too,
value for value equal to deltalake's read.

No crash faults here (test_mirror proves the state computation under them, for both formats alike); one plugin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pgpoll.materialize.delta import files as delta_files
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.layout import table_dir_name
from pgpoll.typed.schemas import TableSchema
from tests.ingest.conftest import ingest
from tests.materialize import test_mirror
from tests.materialize.conftest import materialize
from tests.materialize.test_mirror import Workload, _assert_mirror

TABLES = ("t_types", "t_toast", "t_full", "t_trunc")


def duckdb_delta_rows(path: Path) -> list[dict[str, Any]]:
    """The rows DuckDB's ``delta_scan`` reads at ``path`` (the extension file ships in duckdb-extension-delta)."""
    import duckdb
    import duckdb_extension_delta

    ext = Path(duckdb_extension_delta.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "delta.duckdb_extension"
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{ext}'")
    location = str(path).replace("'", "''")
    return list(con.execute(f"SELECT * FROM delta_scan('{location}')").to_arrow_table().to_pylist())


def _nan_free(value: Any) -> Any:
    """``value`` with NaN floats as a string (NaN equals nothing, not even itself)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_free(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_free(v) for v in value]
    return value


def _same_rows(duck: list[dict[str, Any]], delta: list[dict[str, Any]], key: str) -> None:
    """Every DuckDB row equals a deltalake row column for column (a multiset match on ``key`` first)."""
    assert len(duck) == len(delta)
    left = [_nan_free(r) for r in delta]
    for row in map(_nan_free, duck):
        match = next((i for i, r in enumerate(left) if r[key] == row[key] and r == row), None)
        assert match is not None, (row, [r for r in left if r[key] == row[key]][:2])
        left.pop(match)


class _CurrentDeltaVersion:
    """Stands in for the SparkSession in ``_assert_mirror``: a state directory is read as the files of its
    current Delta version (what Delta readers see), not every Parquet file under it."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.read = self

    def parquet(self, path: str) -> Any:
        return self.spark.read.option("mergeSchema", "true").parquet(*DeltaTable(path).file_uris())


def _delta_state_schema(out: Path, table: str, state: str = "state") -> TableSchema:
    """The state's table shape: its schema id is in pgpoll's object of the newest commit."""
    newest = DeltaTable(str(out / state / table_dir_name("public", table))).history(1)[0]
    schema_id = json.loads(newest["pgpoll"])["schema_id"]
    return TableSchema.from_json((out / "_pgpoll" / "schemas" / f"{schema_id}.json").read_text())


@pytest.mark.parametrize("engine", ["spark", "driver"])
def test_delta_tables_mirror_the_source(db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        engine: str) -> None:
    """With Spark, files of one row: incremental runs rewrite only some; in the driver, one file per table."""
    monkeypatch.setattr(test_mirror, "_state_schema", _delta_state_schema)
    monkeypatch.setattr(delta_files, "TARGET_ROWS", 1)  # a file per row: incremental runs rewrite only some of them
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", engine)
    db.require_plugin("pgoutput")
    work = Workload(db, seed=db.major * 10 + 3)
    work.create()
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute(f"CREATE PUBLICATION mirror FOR TABLE {', '.join(TABLES)}")
    out = tmp_path / "out"
    args = ["--slot", slot, "--output", str(out), "--typed-tables", "--batch-changes", "40", "--publication", "mirror"]
    versions: dict[str, int] = {}
    kept: dict[str, int] = {}  # files the third (incremental) run kept, per table
    for round_number in range(3):  # the ADD COLUMN comes in the second
        work.run(60)
        if round_number == 1:
            db.execute("ALTER TABLE t_types ADD COLUMN c_added text")
            db.execute("UPDATE t_types SET c_added = 'after add' WHERE id IN (SELECT id FROM t_types LIMIT 2)")
            work.run(20)
        assert ingest(db.dsn, *args).exit_code == 0
        code, tables, err = materialize(str(out), "--format", "delta")
        assert code == 0, err
        for t in tables:
            assert t["format"] == "delta" and t["version"] == versions.get(t["table"], -1) + 1, t
            assert t["engine"] == engine, t
            versions[t["table"]] = t["version"]
            if round_number == 2 and "files" in t:
                kept[t["table"]] = t["files"]["kept"]
        for table in TABLES:
            path = out / "state" / table_dir_name("public", table)
            if path.exists():
                _assert_mirror(db, _CurrentDeltaVersion(spark), out, table)
                first = "a" if table == "t_full" else "id"  # deltalake reads the same rows (first column compared)
                read = read_delta(str(path))
                source = [r[0] for r in db.execute(f"SELECT {first} FROM {table}")]
                assert sorted(read.column(first).to_pylist(), key=lambda v: (v is None, v)) == sorted(
                    source, key=lambda v: (v is None, v))
                _same_rows(duckdb_delta_rows(path), read.to_pylist(), first)  # and DuckDB reads the same values
    assert set(versions) >= {"public.t_types", "public.t_toast", "public.t_full"}
    if engine == "spark":
        assert kept["public.t_types"] > 0 and kept.get("public.t_full", 0) == 0, kept  # a file per row; t_full has no key
    else:
        assert kept and not any(kept.values()), kept  # a small table's one file is rewritten whole
