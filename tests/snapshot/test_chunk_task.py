"""A chunk in a task: the typed tables' values for the same rows, the row filter (no server needed), and
lock-timeout retries against a real lock."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from pgpoll.errors import LockTimeoutError
from pgpoll.sink.envelope import ChangeColumns
from pgpoll.sink.typed_columns import typed_columns_batch
from pgpoll.snapshot import chunk_task
from pgpoll.snapshot.chunk_task import ChunkWork, filter_rows, run_chunks, typed_chunk
from pgpoll.source.snapshot.reads import ChunkSpec
from pgpoll.typed.rows import ColumnLedger, TypedLayout
from pgpoll.typed.schemas import TableSchema, schema_from_columns

_COLUMNS = [
    ("id", "integer"), ("n", "numeric(5,2)"), ("d", "date"), ("ts", "timestamp without time zone"),
    ("tz", "timestamp with time zone"), ("arr", "integer[]"), ("b", "bytea"), ("f", "double precision"),
    ("ok", "boolean"), ("tx", "text"), ("iv", "interval"), ("_op", "bigint"), ("r", "real"),
]
_ROWS: list[dict[str, str | None]] = [
    {"id": "1", "n": "12.50", "d": "2024-01-31", "ts": "2024-06-01 12:00:50.5", "tz": "2024-06-01 12:00:50.123456+02",
     "arr": "{1,2,NULL}", "b": "\\x00ff", "f": "1.5", "ok": "true", "tx": "x", "iv": "1 day 02:00:00", "_op": "-7",
     "r": "0.1"},
    {"id": "2", "n": "NaN", "d": "infinity", "ts": "0001-01-01 00:00:00 BC", "tz": "1850-01-01 00:00:00+05:53:28",
     "arr": "{{1},{2}}", "b": None, "f": "-Infinity", "ok": "false", "tx": "", "iv": "-00:00:01.5", "_op": None,
     "r": "NaN"},
]


def _shape() -> TableSchema:
    return schema_from_columns("public", "t", _COLUMNS, None)


def _texts(rows: list[dict[str, str | None]]) -> pa.Table:
    return pa.table({name: pa.array([r[name] for r in rows], pa.string()) for name, _t in _COLUMNS})


def test_a_chunk_holds_exactly_what_the_typed_tables_hold_for_the_same_rows() -> None:
    shape = _shape()
    chunk = typed_chunk(_texts(_ROWS), shape)
    cols = ChangeColumns()
    for row in _ROWS:
        cols.add_row(10, "I", "public", "t", None, (), list(row), list(row.values()), [], shape.schema_id)
    cols.fill_transaction(100, 7, 1_700_000_000_000_000, 0)
    typed = typed_columns_batch(cols.to_batch(), TypedLayout.build([shape], ColumnLedger()))
    own = [f.name for f in chunk.schema if f.name not in ("_untyped", "_schema_id")]
    assert "_op__2" in own  # a column named like a meta column gets the typed tables' physical name
    for name in [*own, "_untyped", "_schema_id"]:
        assert chunk.schema.field(name).type == typed.schema.field(name).type, name
        assert repr(chunk.column(name).to_pylist()) == repr(typed.column(name).to_pylist()), name  # (NaN too)
    assert chunk.column("_untyped").to_pylist()[1] is not None  # NaN numeric, infinity date...


def test_an_empty_chunk_has_the_typed_columns() -> None:
    chunk = typed_chunk(_texts([]), _shape())
    assert chunk.num_rows == 0 and chunk.schema.names[-2:] == ["_untyped", "_schema_id"]


def test_a_client_side_row_filter_keeps_the_rows_an_insert_would_keep() -> None:
    rows = [dict(_ROWS[0], id=str(i)) for i in range(10)]
    kept = filter_rows(_texts(rows), _shape(), ("public.t: (id > 6 OR id = 2)",))
    assert kept.column("id").to_pylist() == ["2", "7", "8", "9"]
    assert filter_rows(_texts(rows), _shape(), ("public.other: (id > 6)",)).num_rows == 10


def test_a_lock_timeout_is_retried_a_few_times_then_comes_back_as_the_chunks_error(
    db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real ACCESS EXCLUSIVE lock held by another session: every attempt times out, the blocker is named."""
    from pgpoll.source.connection import connect, resolve_dsn
    from pgpoll.source.snapshot.catalog import describe_table

    db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    conn = connect(resolve_dsn(db.dsn))
    try:
        table = describe_table(conn, "public", "t", plugin="pgoutput")
    finally:
        conn.close()
    holder = db.connect(autocommit=False)
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        monkeypatch.setattr(chunk_task, "LOCK_BACKOFF_S", 0.0)
        works = [ChunkWork(dsn=db.dsn, output=str(tmp_path), snapshot_id="20260101T000000Z-abcd", table=table,
                           chunk=ChunkSpec(n), lock_timeout_ms=50) for n in (0, 1)]
        results = list(run_chunks(works))
    finally:
        holder.rollback()
        holder.close()
    retries = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retries) == chunk_task.LOCK_ATTEMPTS - 1  # the partition stops at its first failed chunk
    assert len(results) == 1 and isinstance(results[0].error, LockTimeoutError) and results[0].n == 0
    assert results[0].error.blocker_pid == pid
    assert not list(tmp_path.rglob("*.parquet"))  # nothing written


def test_a_chunk_file_has_statistics_for_its_key_columns_only(tmp_path: Any) -> None:
    """Snapshot files are read whole: the other columns' statistics would only cost the writer (no server needed)."""
    import pyarrow.parquet as pq

    chunk = typed_chunk(_texts(_ROWS), _shape())
    path = str(tmp_path / "chunk.parquet")
    chunk_task.write_batches(path, [chunk], chunk.schema.empty_table(), statistics=["id"])
    group = pq.ParquetFile(path).metadata.row_group(0)
    with_stats = {group.column(i).path_in_schema for i in range(group.num_columns)
                  if group.column(i).statistics is not None}
    assert with_stats == {"id"}
    assert pq.read_table(path).column("id").to_pylist() == [1, 2]
