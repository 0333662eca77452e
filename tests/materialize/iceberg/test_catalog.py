"""Which catalog a run opens (the default SQLite one, or one configured the pyiceberg way) and how names map to
identifiers: an odd schema and table name round-trip through the catalog and read back with pyiceberg, DuckDB and
polars (no server, no Spark: the catalog and the commit edge alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgpoll.errors import ConfigError, SinkError
from pgpoll.materialize.iceberg.catalog import identifier, open_catalog
from pgpoll.materialize.iceberg.table import IcebergStateTable, write_data_files
from tests.materialize.iceberg.test_mirror import duckdb_iceberg_rows, polars_rows, pyiceberg_rows


def test_a_local_dest_needs_no_configuration(tmp_path: Path) -> None:
    catalog = open_catalog(None, str(tmp_path / "dest"))
    assert catalog.name == "pgpoll" and catalog.properties["uri"] == f"sqlite:///{tmp_path}/dest/_catalog.db"
    assert catalog.properties["warehouse"] == f"file://{tmp_path}/dest"


def test_an_object_store_dest_without_a_catalog_names_the_settings() -> None:
    with pytest.raises(ConfigError) as raised:
        open_catalog(None, "s3://lake/state")
    assert "--catalog" in str(raised.value) and "PYICEBERG_CATALOG__LAKE__URI" in str(raised.value)
    with pytest.raises(ConfigError, match="no Iceberg catalog named 'absent'"):
        open_catalog("absent", "/tmp")


def test_a_catalog_configured_by_environment_variables_is_read_at_run_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYICEBERG_CATALOG__MINE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__MINE__URI", f"sqlite:///{tmp_path}/mine.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__MINE__WAREHOUSE", f"file://{tmp_path}/wh")
    catalog = open_catalog("mine", "/unused")
    assert catalog.name == "mine" and catalog.properties["uri"] == f"sqlite:///{tmp_path}/mine.db"
    monkeypatch.setenv("PYICEBERG_CATALOG__BROKEN__TYPE", "nonsense")
    with pytest.raises(SinkError, match="cannot open the Iceberg catalog 'broken'"):
        open_catalog("broken", "/unused")


def test_odd_names_round_trip_and_every_reader_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    catalog = open_catalog(None, str(tmp_path))
    rows = pa.table({"the id": pa.array([1, 2], pa.int64()), "a,b;c": pa.array(["x", None])})
    table = IcebergStateTable(catalog, identifier("My.Schema", "odd name%20"), "/out")
    snapshot, added = table.commit(table.pin(), rows.schema, lambda md, io: write_data_files(md, io, rows, 10), None,
                                   {"position": "0/10"}, 16)
    assert snapshot is not None and len(added) == 1
    loaded = catalog.load_table(("My.Schema", "odd name%20"))
    reader: Any
    for reader in (pyiceberg_rows, duckdb_iceberg_rows, polars_rows):
        assert sorted(reader(loaded), key=lambda r: r["the id"]) == rows.to_pylist(), reader
    # the same position again commits nothing
    assert table.commit(table.pin(), rows.schema, lambda md, io: [], None, {"position": "0/10"}, 16) == (None, [])


def test_catalog_goes_with_format_iceberg_only(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pgpoll.cli.main import cli

    result = CliRunner().invoke(cli, ["materialize", "--output", str(tmp_path), "--catalog", "lake"])
    assert result.exit_code == 2 and "--catalog applies to --format iceberg only" in result.stderr
