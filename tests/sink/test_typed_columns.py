"""The vectorised typed rows equal the per-row ones, value for value, fallbacks and schema changes included."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgpoll.sink.envelope import ChangeColumns
from pgpoll.sink.typed_columns import typed_columns_batch
from pgpoll.typed.rows import ColumnLedger, TypedLayout, typed_batch
from pgpoll.typed.schemas import TableSchema, schema_from_columns

_COLUMNS = [
    ("id", "integer"), ("n", "numeric(5,2)"), ("d", "date"), ("ts", "timestamp without time zone"),
    ("tz", "timestamp with time zone"), ("arr", "integer[]"), ("b", "bytea"), ("f", "double precision"),
    ("ok", "boolean"), ("tx", "text"), ("iv", "interval"), ("big", "bigint"), ("r", "real"),
]
_NORMAL = {
    "id": "1", "n": "12.50", "d": "2024-01-31", "ts": "2024-06-01 12:00:50.5", "tz": "2024-06-01 12:00:50.123456+02",
    "arr": "{1,2,NULL}", "b": "\\x00ff", "f": "1.5", "ok": "true", "tx": "x", "iv": "1 day 02:00:00", "big": "-7",
    "r": "0.1",
}
_ODD = {
    "id": "2", "n": "NaN", "d": "infinity", "ts": "0001-01-01 00:00:00 BC", "tz": "1850-01-01 00:00:00+05:53:28",
    "arr": "{{1},{2}}", "b": None, "f": "-Infinity", "ok": "false", "tx": None, "iv": "-00:00:01.5", "big": None,
    "r": "NaN",
}


def _shape(columns: list[tuple[str, str]]) -> TableSchema:
    return schema_from_columns("public", "t", columns, None)


def _batch(rows: list[tuple[str, dict[str, str | None] | None, dict[str, str | None] | None, str | None]]) -> pa.RecordBatch:
    cols = ChangeColumns()
    for op, before, after, sid in rows:
        cols.add_row(
            10, op, "public", "t", None if before is None else list(before), () if before is None else list(before.values()),
            None if after is None else list(after), () if after is None else list(after.values()), [], sid,
        )
    cols.fill_transaction(100, 7, 1_700_000_000_000_000, 0)
    return cols.to_batch()


@pytest.mark.parametrize("sliced", [False, True])
def test_vectorised_typed_rows_equal_the_per_row_ones(sliced: bool) -> None:
    first = _shape(_COLUMNS)
    retyped = _shape([("id", "text"), ("n", "numeric(5,2)"), ("extra", "date")])  # id changes type: a new column
    layout = TypedLayout.build([first, retyped], ColumnLedger())
    a, b = first.schema_id, retyped.schema_id
    batch = _batch([
        ("I", None, dict(_NORMAL), a),
        ("I", None, dict(_ODD), a),
        ("U", {"id": "1"}, dict(_NORMAL, n="13.00"), a),
        ("U", None, dict(_ODD, ok="true"), a),
        ("U", dict(_ODD), dict(_NORMAL), a),
        ("D", {"id": "1"}, None, a),
        ("D", None, None, a),
        ("T", None, None, None),
        ("I", None, {"id": "abc", "n": "1.00", "extra": "2024-02-02"}, b),
        ("D", {"id": "abc"}, None, b),
        ("I", None, {"id": "3", "n": "999.999", "d": "10000-01-01"}, a),
    ])
    if sliced:
        batch = batch.slice(1, batch.num_rows - 2)
    expected = typed_batch(batch, layout)
    got = typed_columns_batch(batch, layout)
    assert got.schema.equals(expected.schema)
    for name in expected.schema.names:  # repr: NaN equals NaN
        assert repr(got.column(name).to_pylist()) == repr(expected.column(name).to_pylist()), name


def test_a_batch_without_fallbacks_has_no_untyped_values() -> None:
    shape = _shape(_COLUMNS)
    layout = TypedLayout.build([shape], ColumnLedger())
    batch = _batch([("I", None, dict(_NORMAL, id=str(i)), shape.schema_id) for i in range(50)])
    got = typed_columns_batch(batch, layout)
    assert got.equals(typed_batch(batch, layout))
    assert got.column("_untyped").null_count == 50 and got.column("id").to_pylist() == list(range(50))


def _rows(n: int, shape: TableSchema, **changes: dict[str, str | None]) -> list[tuple[str, None, dict[str, str | None], str]]:
    out = [("I", None, dict(_NORMAL, id=str(i)), shape.schema_id) for i in range(n)]
    for i, after in changes.items():
        out[int(i[1:])] = ("I", None, after, shape.schema_id)
    return out


def _regular(batch: pa.RecordBatch) -> dict[str, int] | None:
    from pgpoll.sink.typed_columns import _Images

    return _Images(batch.column("after")).regular


@pytest.mark.parametrize("case", ["same keys", "sliced", "one row reordered", "one row shorter", "one row renamed",
                                  "updates with old rows"])
def test_rows_with_the_same_keys_in_the_same_order_take_every_kth_value_and_others_do_not(case: str) -> None:
    shape = _shape(_COLUMNS)
    layout = TypedLayout.build([shape], ColumnLedger())
    reordered = dict(reversed(list(_NORMAL.items())))
    shorter = {k: v for k, v in _NORMAL.items() if k != "tx"}
    renamed = {("zz" if k == "tx" else k): v for k, v in _NORMAL.items()}
    rows: list[tuple[str, dict[str, str | None] | None, dict[str, str | None] | None, str | None]] = list(
        _rows(40, shape, **({"r7": reordered} if case == "one row reordered" else {"r7": shorter} if case == "one row shorter"
                            else {"r7": renamed} if case == "one row renamed" else {})))
    if case == "updates with old rows":
        rows += [("U", dict(_ODD, id="3"), dict(_NORMAL, id="4", n="1.25"), shape.schema_id)]
    batch = _batch(rows)
    if case == "sliced":
        batch = batch.slice(3, 30)
    assert (_regular(batch) is not None) == (case in ("same keys", "sliced", "updates with old rows"))
    expected = typed_batch(batch, layout)
    got = typed_columns_batch(batch, layout)
    assert got.schema.equals(expected.schema)
    for name in expected.schema.names:
        assert repr(got.column(name).to_pylist()) == repr(expected.column(name).to_pylist()), name
