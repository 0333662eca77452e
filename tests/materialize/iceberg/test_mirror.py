"""Mirror equality with ``--format iceberg``: the random workload of test_mirror (every type, TOAST, FULL identity,
truncates, an ADD COLUMN mid-stream) over several ingest runs killed at random crash points, both plugins; after each
incremental materialize every Iceberg table equals ``SELECT *`` from the source value for value, read back through
the catalog three ways: pyiceberg's scan, DuckDB's ``iceberg_scan`` (of the metadata file the catalog points to) and
polars' ``scan_iceberg``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgpoll.typed.schemas import TableSchema
from tests.ingest.conftest import ingest, ingest_process
from tests.materialize import test_mirror
from tests.materialize.conftest import materialize
from tests.materialize.test_mirror import FAULTS, Workload, _assert_mirror

TABLES = ("t_types", "t_toast", "t_full", "t_trunc")
Reader = Callable[[Any], list[dict[str, Any]]]


def duckdb_iceberg_rows(table: Any) -> list[dict[str, Any]]:
    """The rows DuckDB's ``iceberg_scan`` reads from the table's current metadata file (the extension files ship in
    duckdb-extension-iceberg and duckdb-extension-avro, pinned to DuckDB's version)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        extension = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{extension}'")
    location = str(table.metadata_location).replace("'", "''")
    return list(con.execute(f"SELECT * FROM iceberg_scan('{location}')").to_arrow_table().to_pylist())


def polars_rows(table: Any, storage_options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The rows polars' ``scan_iceberg`` reads (planned by pyiceberg; its own object-store reader needs
    ``storage_options`` for an S3 endpoint)."""
    import polars as pl

    return list(pl.scan_iceberg(table, storage_options=storage_options).collect().to_arrow().to_pylist())


def pyiceberg_rows(table: Any) -> list[dict[str, Any]]:
    return list(table.scan().to_arrow().to_pylist())


READERS: dict[str, Reader] = {"pyiceberg": pyiceberg_rows, "duckdb": duckdb_iceberg_rows, "polars": polars_rows}


class _Row(dict[str, Any]):
    """A read row as ``_assert_mirror`` takes a Spark Row: ``row[name]``, ``_untyped`` as a dict."""


class _Rows:
    """Stands in for the SparkSession in ``_assert_mirror``: ``read.parquet(<table>)`` is the table's rows as one
    Iceberg reader reads them through the catalog."""

    def __init__(self, catalog: Callable[[], Any], reader: Reader) -> None:
        self.catalog = catalog
        self.reader = reader
        self.read = self

    def parquet(self, path: str) -> Any:
        table = self.catalog().load_table(("public", Path(path).name.split(".", 1)[1]))
        rows = [_Row(r, _untyped=dict(r["_untyped"]) if r["_untyped"] else None) for r in self.reader(table)]
        return _Collected(rows)


class _Collected:
    def __init__(self, rows: list[_Row]) -> None:
        self.rows = rows

    def collect(self) -> list[_Row]:
        return self.rows


def iceberg_schema_of(catalog: Callable[[], Any]) -> Callable[..., TableSchema]:
    """``_state_schema`` for Iceberg tables: the schema id is pgpoll's property of the current snapshot."""

    def schema(out: Path, table: str, state: str = "state") -> TableSchema:
        current = catalog().load_table(("public", table)).current_snapshot()
        schema_id = current.summary["pgpoll.schema-id"]
        return TableSchema.from_json((out / "_pgpoll" / "schemas" / f"{schema_id}.json").read_text())

    return schema


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_iceberg_tables_mirror_the_source(db: Any, spark: Any, tmp_path: Path, plugin: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.materialize.iceberg.test_iceberg_state import catalog

    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    out = tmp_path / "out"
    # pgoutput: a second DEST computed with Spark in the last two rounds (a first build, then an incremental run
    # that reads the previous state through pyiceberg into Spark)
    db.require_plugin(plugin)
    work = Workload(db, seed=db.major * 10 + 5 + (plugin == "pgoutput"))
    work.create()
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    args = ["--slot", slot, "--output", str(out), "--typed-tables", "--batch-changes", "40"]
    if plugin == "pgoutput":
        db.execute(f"CREATE PUBLICATION mirror FOR TABLE {', '.join(TABLES)}")
        args += ["--publication", "mirror"]
    r = random.Random(11)
    snapshots: dict[str, int] = {}
    for round_number in range(3):
        work.run(60)
        if round_number == 1:
            db.execute("ALTER TABLE t_types ADD COLUMN c_added text")
            db.execute("UPDATE t_types SET c_added = 'after add' WHERE id IN (SELECT id FROM t_types LIMIT 2)")
            work.run(20)
        fault = r.choice(FAULTS)
        crashed = ingest_process(db.dsn, *args, env={"PGPOLL_FAULT": fault})
        assert crashed.exit_code == 137, f"fault {fault}: {crashed.stderr[-2000:]}"
        assert ingest(db.dsn, *args).exit_code == 0
        dests = {"state": "driver", "state-spark": "spark"} if plugin == "pgoutput" and round_number else {"state": "driver"}
        for dest, engine in dests.items():
            open_catalog = lambda dest=dest: catalog(out / dest)  # noqa: E731 (a fresh catalog object per read)
            monkeypatch.setattr(test_mirror, "_state_schema", iceberg_schema_of(open_catalog))
            monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", engine if engine == "spark" else "auto")
            code, tables, err = materialize(str(out), "--format", "iceberg", "--to", str(out / dest))
            assert code == 0, err
            for t in tables:  # one snapshot per changed table and run
                assert t["format"] == "iceberg" and t.get("engine") in (engine, None), t
                history = len(list(open_catalog().load_table(("public", t["table"].split(".")[1])).snapshots()))
                assert history == snapshots.get(dest + t["table"], 0) + (t["mode"] != "unchanged"), (t, history)
                snapshots[dest + t["table"]] = history
            for table in TABLES:
                if open_catalog().table_exists(("public", table)):
                    for reader in READERS.values():
                        _assert_mirror(db, _Rows(open_catalog, reader), out, table)
    assert set(snapshots) >= {"statepublic.t_types", "statepublic.t_toast", "statepublic.t_full"}
