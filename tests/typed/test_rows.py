"""Typed change rows, without Spark or a server: the column ledger's physical names and ``typed_batch``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date
from decimal import Decimal
from typing import Any, TypeAlias

import pyarrow as pa

from pgpoll.sink.envelope import ChangeColumns
from pgpoll.typed.mapping import PgType, type_from_name
from pgpoll.typed.rows import META_COLUMNS, ColumnLedger, TypedLayout, typed_batch
from pgpoll.typed.schemas import ColumnSchema, TableSchema

INT = type_from_name("integer")
TEXT = type_from_name("text")
NUM52 = type_from_name("numeric(5,2)")


def _schema(*columns: tuple[str, str], key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema("public", "t", tuple(ColumnSchema(n, type_from_name(t)) for n, t in columns), key, "d")


# ---- the column ledger ------------------------------------------------------------------


def test_a_column_keeps_its_name_while_its_spark_type_stays() -> None:
    ledger = ColumnLedger()
    assert ledger.physical("v", type_from_name("character varying(10)")) == "v"
    # a different PostgreSQL type with the same Spark type (string) is the same physical column
    assert ledger.physical("v", type_from_name("character varying(20)")) == "v"
    assert ledger.physical("v", TEXT) == "v"
    assert ledger.physical("n", type_from_name("integer")) == "n"
    assert [e.physical for e in ledger.entries] == ["v", "n"]


def test_a_type_change_writes_the_column_under_name_and_type_tag() -> None:
    ledger = ColumnLedger()
    assert ledger.physical("a", INT) == "a"
    assert ledger.physical("a", TEXT) == "a__string"
    assert ledger.physical("n", NUM52) == "n"
    assert ledger.physical("n", type_from_name("numeric(12,2)")) == "n__decimal_12_2"
    # changing back finds the first entry again: no third column
    assert ledger.physical("a", INT) == "a"
    assert [(e.name, e.physical) for e in ledger.entries] == [
        ("a", "a"), ("a", "a__string"), ("n", "n"), ("n", "n__decimal_12_2")
    ]


def test_meta_column_names_and_case_insensitive_twins_get_a_suffix() -> None:
    ledger = ColumnLedger()
    assert ledger.physical("_op", TEXT) == "_op__2"
    assert ledger.physical("_Commit_LSN", INT) == "_Commit_LSN__2"  # Spark compares names ignoring case
    assert ledger.physical("A", INT) == "A"
    assert ledger.physical("a", INT) == "a__2"
    assert ledger.physical("a__2", INT) == "a__2__2"  # a real column named like a suffixed one
    physical = [e.physical.lower() for e in ledger.entries]
    assert len(set(physical)) == len(physical)
    assert not set(physical) & {m.lower() for m in META_COLUMNS}


def test_the_ledger_json_round_trip_keeps_physical_names() -> None:
    ledger = ColumnLedger()
    for name, t in [("id", INT), ("_op", TEXT), ("A", INT), ("a", INT), ("a", TEXT), ("tags", type_from_name("text[]"))]:
        ledger.physical(name, t)
    assert ledger.changed
    loaded = ColumnLedger.from_json(json.loads(json.dumps(ledger.to_json())))
    assert loaded.entries == ledger.entries and not loaded.changed
    # asking the loaded ledger again gives the same names and adds nothing
    assert [loaded.physical(e.name, e.type) for e in ledger.entries] == [e.physical for e in ledger.entries]
    assert not loaded.changed and len(loaded.entries) == len(ledger.entries)


def test_the_layout_carries_every_ledger_column_even_ones_the_batch_does_not_have() -> None:
    ledger = ColumnLedger()
    ledger.physical("dropped", type_from_name("date"))  # from an earlier batch
    ledger.physical("a", INT)
    now = _schema(("id", "integer"), ("a", "text"))
    layout = TypedLayout.build([now], ledger)
    assert [c[0] for c in layout.columns] == ["dropped", "a", "id", "a__string"]
    assert layout.physical == {now.schema_id: {"id": "id", "a": "a__string"}}
    schema = layout.arrow_schema()
    assert schema.names == ["dropped", "a", "id", "a__string", *META_COLUMNS]
    assert [f.name for f in schema.field("_before").type] == ["dropped", "a", "id", "a__string"]
    assert layout.spark_ddl().startswith("`dropped` date, `a` int, `id` int, `a__string` string, `_op` string")


# ---- typed_batch --------------------------------------------------------------------------

Image: TypeAlias = Sequence[tuple[str, str | None]] | None


def _envelope(rows: Sequence[tuple[str, Image, Image, list[str], str | None]]) -> pa.RecordBatch:
    """One transaction of ``(op, before, after, unchanged_toast, schema_id)`` rows of public.t."""
    cols = ChangeColumns()
    for i, (op, before, after, toast, sid) in enumerate(rows):
        cols.add_row(
            100 + i, op, "public", "t",
            None if before is None else [k for k, _ in before], [] if before is None else [v for _, v in before],
            None if after is None else [k for k, _ in after], [] if after is None else [v for _, v in after],
            toast, sid,
        )
    cols.add_message(200, "app", b"not a table row", True)
    cols.fill_transaction(0x1000, 7, 1_700_000_000_000_000, 0)
    batch = cols.to_batch()
    return batch.filter(pa.array([op != "M" for op in batch.column("op").to_pylist()]))


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    return batch.to_pylist()


def test_typed_rows_take_the_new_row_for_insert_and_update_and_the_old_row_for_delete() -> None:
    s = _schema(("id", "integer"), ("n", "numeric(5,2)"), ("v", "text"))
    layout = TypedLayout.build([s], ColumnLedger())
    envelope = _envelope([
        ("I", None, [("id", "1"), ("n", "1.50"), ("v", "one")], [], s.schema_id),
        ("U", None, [("id", "1"), ("n", "2.00"), ("v", "uno")], [], s.schema_id),
        ("U", [("id", "1"), ("n", "2.00"), ("v", "uno")], [("id", "2"), ("n", "2.25"), ("v", "dos")], [], s.schema_id),
        ("D", [("id", "2")], None, [], s.schema_id),
        ("T", None, None, [], None),
    ])
    rows = _rows(typed_batch(envelope, layout))
    assert [(r["_op"], r["id"], r["n"], r["v"]) for r in rows] == [
        ("I", 1, Decimal("1.50"), "one"),
        ("U", 1, Decimal("2.00"), "uno"),
        ("U", 2, Decimal("2.25"), "dos"),
        ("D", 2, None, None),  # the old key only
        ("T", None, None, None),
    ]
    # _before: only an UPDATE that came with an old image
    assert [r["_before"] for r in rows] == [
        None, None, {"id": 1, "n": Decimal("2.00"), "v": "uno"}, None, None
    ]
    assert [(r["_commit_lsn"], r["_seq"]) for r in rows] == [(0x1000, i) for i in range(5)]
    assert {str(r["_commit_ts"]) for r in rows} == {"2023-11-14 22:13:20+00:00"}
    assert [r["_schema_id"] for r in rows] == [s.schema_id] * 4 + [None]
    assert all(r["_untyped"] is None for r in rows)


def test_a_value_the_typed_column_cannot_hold_is_null_there_and_kept_in_untyped() -> None:
    s = _schema(("id", "integer"), ("n", "numeric(5,2)"))
    layout = TypedLayout.build([s], ColumnLedger())
    envelope = _envelope([
        ("I", None, [("id", "1"), ("n", "NaN")], [], s.schema_id),
        ("U", [("id", "1"), ("n", "NaN")], [("id", "1"), ("n", "Infinity")], [], s.schema_id),
        ("D", [("id", "1"), ("n", "-Infinity")], None, [], s.schema_id),
    ])
    rows = _rows(typed_batch(envelope, layout))
    assert [r["n"] for r in rows] == [None, None, None]
    assert rows[1]["_before"] == {"id": 1, "n": None}
    assert [r["_untyped"] for r in rows] == [
        [("n", "NaN")],
        [("n", "Infinity"), ("_before.n", "NaN")],
        [("n", "-Infinity")],
    ]


def test_unchanged_toast_is_passed_through() -> None:
    s = _schema(("id", "integer"), ("big", "text"))
    layout = TypedLayout.build([s], ColumnLedger())
    envelope = _envelope([
        ("I", None, [("id", "1"), ("big", "x" * 10)], [], s.schema_id),
        ("U", None, [("id", "1"), ("big", None)], ["big"], s.schema_id),
    ])
    rows = _rows(typed_batch(envelope, layout))
    assert [r["_unchanged_toast"] for r in rows] == [[], ["big"]]
    assert rows[1]["big"] is None


def test_rows_of_another_schema_version_leave_the_other_versions_columns_null() -> None:
    old = _schema(("id", "integer"), ("a", "integer"), ("gone", "text"))
    new = _schema(("id", "integer"), ("a", "text"), ("added", "date"))
    layout = TypedLayout.build([old, new], ColumnLedger())
    assert [c[0] for c in layout.columns] == ["id", "a", "gone", "a__string", "added"]
    envelope = _envelope([
        ("I", None, [("id", "1"), ("a", "5"), ("gone", "g")], [], old.schema_id),
        ("I", None, [("id", "2"), ("a", "five"), ("added", "2024-02-29")], [], new.schema_id),
        # a row whose schema id the layout does not know: no typed values at all
        ("I", None, [("id", "3"), ("a", "7")], [], "unknown-schema-id"),
    ])
    rows = _rows(typed_batch(envelope, layout))
    own = ["id", "a", "gone", "a__string", "added"]
    assert [[r[c] for c in own] for r in rows][:2] == [
        [1, 5, "g", None, None],
        [2, None, None, "five", date(2024, 2, 29)],
    ]
    assert [rows[2][c] for c in own] == [None] * 5
    assert [r["_schema_id"] for r in rows] == [old.schema_id, new.schema_id, "unknown-schema-id"]


def test_meta_named_and_case_twin_columns_land_in_their_physical_columns() -> None:
    s = _schema(("id", "integer"), ("_op", "text"), ("A", "integer"), ("a", "integer"))
    layout = TypedLayout.build([s], ColumnLedger())
    envelope = _envelope([("I", None, [("id", "1"), ("_op", "mine"), ("A", "10"), ("a", "20")], [], s.schema_id)])
    [row] = _rows(typed_batch(envelope, layout))
    assert (row["_op"], row["_op__2"], row["A"], row["a__2"]) == ("I", "mine", 10, 20)


def test_a_table_without_columns_still_gets_a_valid_batch() -> None:
    layout = TypedLayout.build([], ColumnLedger())
    envelope = _envelope([("T", None, None, [], None)])
    [row] = _rows(typed_batch(envelope, layout))
    assert row["_op"] == "T" and row["_before"] is None


def test_pg_type_of_every_ledger_entry_survives_json() -> None:
    t = PgType("array", "numeric(5,2)[]", element=NUM52)
    ledger = ColumnLedger()
    ledger.physical("xs", t)
    assert ColumnLedger.from_json(ledger.to_json()).entries[0].type == t


def test_xid_is_a_meta_column_carrying_the_envelopes_full_id() -> None:
    full = 7 * (1 << 32) + 0xFFFFFFF0
    s = _schema(("id", "integer"), ("_xid", "text"), ("_XID", "integer"))
    ledger = ColumnLedger()
    layout = TypedLayout.build([s], ledger)
    assert [c[0] for c in layout.columns] == ["id", "_xid__2", "_XID__3"]  # a user column never takes the name
    cols = ChangeColumns()
    cols.add_row(100, "I", "public", "t", None, [], ["id", "_xid", "_XID"], ["1", "mine", "5"], [], s.schema_id)
    cols.fill_transaction(0x1000, full, 1_700_000_000_000_000, 0)
    [row] = _rows(typed_batch(cols.to_batch(), layout))
    assert (row["_xid"], row["_xid__2"], row["_XID__3"]) == (full, "mine", 5)
    schema = layout.arrow_schema()
    assert schema.field("_xid").type == pa.int64()
    assert schema.names.index("_xid") == schema.names.index("_commit_ts") + 1
    assert "`_commit_ts` timestamp, `_xid` bigint" in layout.spark_ddl()


def test_a_ledger_from_before_xid_that_stores_a_column_as_xid_is_refused() -> None:
    import pytest

    from pgpoll.errors import SinkError

    old = ColumnLedger.from_json({"columns": [{"name": "_xid", "spark_type": "int", "physical": "_xid",
                                               "type": INT.to_json()}]})
    with pytest.raises(SinkError, match='stores its column "_xid" as "_xid"'):
        TypedLayout.build([_schema(("id", "integer"), ("_xid", "integer"))], old)
