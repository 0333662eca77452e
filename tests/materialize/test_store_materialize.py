"""``pgpoll materialize`` with an output and a Delta DEST on an object store (SeaweedFS): no JVM where the driver
engine computes the state, Spark's tasks reading and writing through pgpoll's client where it does not."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.materialize.delta.names import logical_table
from pgpoll.sink.change_table import delta_location
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from tests.ingest.conftest import Capture, ingest, make_capture


@pytest.fixture(params=["test_decoding", "pgoutput"])
def capture(request: pytest.FixtureRequest, db: Any, s3_bucket: StoreBucket) -> Capture:
    """A captured table for each plugin, its output on the test S3 store."""
    return make_capture(db, request.param, s3_bucket.child("out"))  # type: ignore[arg-type]


def _state(dest: str, table: str = "public.items") -> list[dict[str, Any]]:
    """The Delta state read back through its own log (file list) with pyarrow."""
    from deltalake import DeltaTable

    fs = open_output(dest)
    found = delta_location(fs, table)
    assert found is not None
    dt = DeltaTable(found[0], storage_options=found[1])
    arrow = fs.arrow()
    import pyarrow.parquet as pq

    parts = [pq.read_table(fs.arrow_path(uri), filesystem=arrow) for uri in dt.file_uris()]
    table_rows = logical_table(pa.concat_tables(parts)) if parts else pa.table({})
    return sorted(table_rows.select(["id", "v"]).to_pylist(), key=lambda r: r["id"])


def _materialize(*args: str) -> Any:
    return CliRunner().invoke(cli, ["materialize", *args, "--json"])


def test_a_small_table_materializes_to_s3_without_a_jvm(capture: Capture, s3_bucket: StoreBucket) -> None:
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 300) g")
    db.execute("UPDATE items SET v = 'u' WHERE id % 7 = 0")
    db.execute("DELETE FROM items WHERE id % 11 = 0")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    dest = s3_bucket.child("state")
    env = {**os.environ, "JAVA_HOME": "/nonexistent", "PATH": "/usr/local/bin:/bin"}  # a JVM start would fail
    proc = subprocess.run([sys.executable, "-m", "pgpoll", "materialize", "--output", capture.output, "--to", dest,
                           "--format", "delta", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert '"engine": "driver"' in proc.stdout
    expected = [{"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM items ORDER BY id")]
    assert _state(dest) == expected
    db.execute("UPDATE items SET v = 'again' WHERE id < 5")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    again = subprocess.run([sys.executable, "-m", "pgpoll", "materialize", "--output", capture.output, "--to", dest,
                            "--format", "delta", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert '"mode": "incremental"' in again.stdout
    assert _state(dest) == [{"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM items ORDER BY id")]


@pytest.mark.parametrize("plugin", ["pgoutput"])
def test_the_spark_engine_reads_and_writes_the_store_through_its_tasks(
    plugin: str, db: Any, s3_bucket: StoreBucket, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = make_capture(db, plugin, s3_bucket.child("out"))  # type: ignore[arg-type]
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 2000) g")
    assert ingest(db.dsn, *capture.args("--typed-tables", "--batch-changes", "700")).exit_code == 0
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", "spark")
    dest = s3_bucket.child("state")
    result = _materialize("--output", capture.output, "--to", dest, "--format", "delta")
    assert result.exit_code == 0, result.output
    assert '"engine": "spark"' in result.output
    db.execute("UPDATE items SET v = 'w' WHERE id BETWEEN 100 AND 120")
    db.execute("DELETE FROM items WHERE id > 1990")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    result = _materialize("--output", capture.output, "--to", dest, "--format", "delta")
    assert result.exit_code == 0, result.output
    assert _state(dest) == [{"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM items ORDER BY id")]


def test_a_parquet_state_on_a_store_is_refused_naming_delta(capture: Capture, s3_bucket: StoreBucket) -> None:
    capture.db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(capture.db.dsn, *capture.args("--typed-tables")).exit_code == 0
    result = _materialize("--output", capture.output)
    assert result.exit_code == 2 and "--format delta" in result.output
    fs = open_output(capture.output)
    assert not fs.exists(fs.path("state"))
