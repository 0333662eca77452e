"""Parquet timestamps: timestamptz and commit times as TIMESTAMP(MICROS) adjusted to UTC, timestamp as not adjusted.

Spark's default (INT96) reads back in pyarrow and DuckDB as a naive timestamp, so
``2024-06-01 12:00:50+02`` would read as ``10:00:50`` with no zone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from tests.ingest.conftest import ingest, make_capture


def test_envelope_and_typed_files_carry_utc_adjusted_micros_and_naive_micros(
    db: Any, tmp_path: Path, spark: Any
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("ALTER TABLE items ADD COLUMN at timestamptz, ADD COLUMN local_at timestamp")
    db.execute(
        "INSERT INTO items VALUES (1, 'a', '2024-06-01 12:00:50.123456+02', '2024-06-01 12:00:50.123456')"
    )
    result = ingest(db.dsn, *capture.args("--typed-tables"))
    assert result.exit_code == 0, result.stderr

    changes = ds.dataset(Path(capture.output) / "changes", format="parquet", partitioning="hive").to_table()
    assert changes.schema.field("commit_ts").type == pa.timestamp("us", tz="UTC")
    table_dir = next((Path(capture.output) / "tables").iterdir())
    typed = ds.dataset(table_dir, format="parquet", partitioning="hive").to_table()
    assert typed.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert typed.schema.field("local_at").type == pa.timestamp("us")
    assert typed.column("at").to_pylist() == [datetime(2024, 6, 1, 10, 0, 50, 123456, tzinfo=UTC)]
    assert typed.column("local_at").to_pylist() == [datetime(2024, 6, 1, 12, 0, 50, 123456)]

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    kinds = dict(con.execute(
        f"SELECT column_name, column_type FROM (DESCRIBE SELECT \"at\", local_at FROM read_parquet('{table_dir}/*/*.parquet'))"
    ).fetchall())
    assert kinds == {"at": "TIMESTAMP WITH TIME ZONE", "local_at": "TIMESTAMP"}
    at, local_at = con.execute(
        f"SELECT \"at\"::text, local_at::text FROM read_parquet('{table_dir}/*/*.parquet')"
    ).fetchone()
    assert (at, local_at) == ("2024-06-01 10:00:50.123456+00", "2024-06-01 12:00:50.123456")
    commit_kind = con.execute(
        f"SELECT column_type FROM (DESCRIBE SELECT commit_ts FROM read_parquet('{capture.output}/changes/lsn_range=*/*.parquet'))"
    ).fetchone()
    assert commit_kind == ("TIMESTAMP WITH TIME ZONE",)
