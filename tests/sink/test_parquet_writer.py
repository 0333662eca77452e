"""The pyarrow writer without a JVM: which writer a path gets, the files' types, typed tables in the same pass."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgpoll.errors import ConfigError
from pgpoll.sink.envelope import ENVELOPE_SCHEMA, ChangeColumns
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.parquet_writer import PYARROW, SPARK, WRITER_ENV, PartFiles, StagingTarget, WriterThread, choose_writer
from pgpoll.sink.typed_tables import TypedTableWriters
from pgpoll.typed.schemas import TableSchema, schema_from_columns

_TS = datetime(2024, 6, 1, 10, 0, 50, 123456, tzinfo=UTC)
_MICROS = int((_TS - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1_000_000)


@pytest.mark.parametrize(
    ("path", "requested", "expected"),
    [
        ("/tmp/out/_pgpoll/staging/x", None, PYARROW),  # checkout-paths: data
        ("file:/tmp/out/_pgpoll/staging/x", None, PYARROW),
        ("file:///tmp/out/_pgpoll/staging/x", "auto", PYARROW),
        ("hdfs://nn:8020/out/_pgpoll/staging/x", None, SPARK),
        ("s3a://bucket/out/_pgpoll/staging/x", None, PYARROW),  # an object store: pgpoll uploads itself
        ("gs://bucket/out/_pgpoll/staging/x", "auto", PYARROW),
        ("az://container/out/_pgpoll/staging/x", "spark", PYARROW),  # (Spark has no connector there)
        ("/tmp/out/_pgpoll/staging/x", "spark", SPARK),  # checkout-paths: data
    ],
)
def test_the_writer_is_pyarrow_where_the_task_reaches_the_output(
    path: str, requested: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WRITER_ENV, raising=False)
    assert choose_writer(path, requested) == expected


def test_the_environment_forces_spark_and_pyarrow_never_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WRITER_ENV, "spark")
    assert choose_writer("/tmp/x") == SPARK  # checkout-paths: data
    monkeypatch.setenv(WRITER_ENV, "pyarrow")
    assert choose_writer("file:/tmp/x") == PYARROW
    with pytest.raises(ConfigError):
        choose_writer("hdfs://nn:8020/x")
    monkeypatch.setenv(WRITER_ENV, "fast")
    with pytest.raises(ConfigError):
        choose_writer("/tmp/x")  # checkout-paths: data


def test_staging_target_of_file_uris_is_os_paths() -> None:
    target = StagingTarget.of("file:/o/_pgpoll/staging/a", "file:/o/_pgpoll/staging/a-tables", "file:/o/_pgpoll/tables")
    expected = StagingTarget(
        "/o/_pgpoll/staging/a",  # checkout-paths: data
        "/o/_pgpoll/staging/a-tables",  # checkout-paths: data
        "/o/_pgpoll/tables",  # checkout-paths: data
    )
    assert target == expected


def _envelope(rows: list[tuple[str, str, str | None, dict[str, str | None] | None, dict[str, str | None] | None]],
              commit_lsn: int, schema_ids: list[str | None]) -> pa.RecordBatch:
    cols = ChangeColumns()
    for (op, table, _unused, before, after), sid in zip(rows, schema_ids, strict=True):
        cols.add_row(
            commit_lsn - 1, op, "public", table,
            None if before is None else list(before), () if before is None else list(before.values()),
            None if after is None else list(after), () if after is None else list(after.values()), [], sid,
        )
    cols.add_message(commit_lsn - 1, "pfx", b"\x00\x01", True)
    cols.fill_transaction(commit_lsn, 700, _MICROS, 0)
    return cols.to_batch()


def _shape(table: str, columns: list[tuple[str, str]]) -> TableSchema:
    return schema_from_columns("public", table, columns, None)


def test_envelope_files_carry_utc_micros_no_partition_column_and_read_back_equal(tmp_path: Path) -> None:
    batch = _envelope([("I", "t", None, None, {"id": "1", "v": "x"})], 0x100, [None])
    files = PartFiles(str(tmp_path / "staging"))
    files.write(batch)
    files.write(batch)
    written = files.close()
    (name, size), = written.items()
    assert name.startswith("part-00000-") and name.endswith(".snappy.parquet")
    assert size == (tmp_path / "staging" / name).stat().st_size
    parquet = pq.ParquetFile(tmp_path / "staging" / name)
    assert parquet.metadata.num_row_groups == 2
    logical = parquet.schema.column(parquet.schema.names.index("commit_ts")).logical_type
    described = json.loads(logical.to_json())
    assert (described["Type"], described["isAdjustedToUTC"], described["timeUnit"]) == ("Timestamp", True, "microseconds")
    table = parquet.read()
    assert table.schema.equals(ENVELOPE_SCHEMA, check_metadata=False)
    assert "lsn_range" not in table.schema.names
    assert table.column("commit_ts").to_pylist() == [_TS] * 4
    assert table.column("message_content").to_pylist()[1] == b"\x00\x01"


def test_typed_rows_in_the_same_pass_agree_with_the_envelope(tmp_path: Path) -> None:
    first = _shape("t", [("id", "integer"), ("at", "timestamp with time zone"), ("local", "timestamp without time zone")])
    second = _shape("t", [("id", "integer"), ("at", "timestamp with time zone"), ("local", "timestamp without time zone"),
                          ("n", "numeric")])
    other = _shape("u", [("k", "text")])
    schemas: dict[str, TableSchema] = {first.schema_id: first, other.schema_id: other}
    writers = TypedTableWriters(str(tmp_path / "tables"), str(tmp_path / "ledgers"), schemas)
    one = _envelope([
        ("I", "t", None, None, {"id": "1", "at": "2024-06-01 12:00:50.123456+02", "local": "2024-06-01 12:00:50.123456"}),
        ("I", "u", None, None, {"k": "a"}),
        ("U", "t", None, {"id": "1"}, {"id": "1", "at": "2024-06-01 13:00:00+00", "local": "2024-06-01 13:00:00"}),
    ], 0x200, [first.schema_id, other.schema_id, first.schema_id])
    writers.write(one)
    schemas[second.schema_id] = second  # an ALTER TABLE in the middle of the batch: a wider file from here on
    two = _envelope([
        ("I", "t", None, None, {"id": "2", "at": None, "local": None, "n": "NaN"}),
        ("T", "t", None, None, None),
        ("D", "u", None, {"k": "a"}, None),
    ], 0x300, [second.schema_id, None, other.schema_id])
    writers.write(two)
    files, ledgers = writers.close()
    t_dir, u_dir = table_dir_name("public", "t"), table_dir_name("public", "u")
    assert sorted(files) == [t_dir, u_dir] and len(files[t_dir]) == 2 and len(files[u_dir]) == 1
    assert sorted(ledgers) == [t_dir, u_dir]
    assert [e["physical"] for e in ledgers[t_dir]["columns"]] == ["id", "at", "local", "n"]

    def read(name: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted((tmp_path / "tables" / name).iterdir(), key=lambda p: p.name):
            out.extend(pq.read_table(path).to_pylist())
        return out

    envelope = pa.Table.from_batches([one, two]).to_pylist()
    for name, table in ((t_dir, "t"), (u_dir, "u")):
        expected = [(r["op"], r["commit_lsn"], r["seq"]) for r in envelope if r["table_name"] == table]
        assert [(r["_op"], r["_commit_lsn"], r["_seq"]) for r in read(name)] == expected
    t_rows = read(t_dir)
    assert t_rows[0]["at"] == _TS and t_rows[0]["local"] == datetime(2024, 6, 1, 12, 0, 50, 123456)
    assert t_rows[1]["_before"]["id"] == 1 and t_rows[2]["id"] == 2 and t_rows[2]["n"] == "NaN"
    first_file = sorted((tmp_path / "tables" / t_dir).iterdir(), key=lambda p: p.name)[0]
    kinds = pq.read_schema(first_file)
    assert kinds.field("at").type == pa.timestamp("us", tz="UTC") and kinds.field("local").type == pa.timestamp("us")


def test_the_writer_thread_runs_jobs_in_order_and_hands_back_the_first_error() -> None:
    done: list[int] = []
    writes = WriterThread()
    for i in range(5):
        writes.submit(lambda i=i: done.append(i))  # type: ignore[misc]
    writes.finish()
    assert done == [0, 1, 2, 3, 4]

    failing = WriterThread(depth=1)

    def boom() -> None:
        raise OSError("disk full")

    failing.submit(boom)
    failing.submit(lambda: done.append(99))  # skipped after the error
    with pytest.raises(OSError, match="disk full"):
        for _ in range(3):
            failing.submit(lambda: None)
        failing.finish()
    assert 99 not in done
