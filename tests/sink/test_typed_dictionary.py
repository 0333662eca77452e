"""Typed files dictionary-encode the meta columns and the table's columns with few distinct values only."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.sink.envelope import ChangeColumns
from pgpoll.sink.typed_tables import TypedTableWriters
from pgpoll.typed.schemas import schema_from_columns


def _envelope(rows: int, sid: str) -> pa.RecordBatch:
    cols = ChangeColumns()
    for i in range(rows):
        after = [str(i), f"name-{i}", "blue" if i % 2 else "red", "{1,2}"]
        cols.add_row(10, "I", "public", "t", None, (), ["id", "name", "colour", "arr"], after, [], sid)
    cols.fill_transaction(100, 7, 1_700_000_000_000_000, 0)
    return cols.to_batch()


def test_distinct_columns_are_written_plain_and_repeated_ones_with_a_dictionary(tmp_path: Path) -> None:
    shape = schema_from_columns("public", "t", [("id", "integer"), ("name", "text"), ("colour", "text"),
                                                ("arr", "integer[]")], None)
    writers = TypedTableWriters(str(tmp_path / "tables"), None, {shape.schema_id: shape})
    writers.write(_envelope(1000, shape.schema_id))
    files, _ = writers.close()
    (name,) = files["public.t"]
    meta = pq.ParquetFile(tmp_path / "tables" / "public.t" / name).metadata
    encodings = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
                 for i in range(meta.num_columns)}
    dictionary = {path for path, used in encodings.items() if any("DICTIONARY" in e for e in used)}
    assert {"colour", "_op", "_commit_lsn", "_schema_id", "_before.colour"} <= dictionary
    assert not {"id", "name", "arr.list.element", "_before.id", "_before.name"} & dictionary
    table = pq.read_table(tmp_path / "tables" / "public.t" / name)
    assert table.column("id").to_pylist() == list(range(1000))
    assert table.column("colour").to_pylist()[:3] == ["red", "blue", "red"]
