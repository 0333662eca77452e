"""The PostgreSQL -> Iceberg type mapping and the schema changes Iceberg allows (pure: no catalog, no server)."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, IntegerType, LongType, NestedField, StringType

from pgpoll.materialize.iceberg.types import (
    iceberg_type,
    nullable_schema,
    promotable,
    refused_changes,
    to_state_types,
    type_changes,
)
from pgpoll.typed.mapping import KINDS, PgType, arrow_type, type_from_name

# every kind of the typed mapping -> its Iceberg type (the README's table)
EXPECTED = {
    "boolean": "boolean", "smallint": "int", "integer": "int", "bigint": "long", "oid": "long", "real": "float",
    "double precision": "double", "numeric(12,3)": "decimal(12, 3)", "numeric(5,-2)": "decimal(7, 0)",
    "numeric(2,4)": "decimal(4, 4)", "numeric": "string", "numeric(40,2)": "string", "text": "string",
    "bytea": "binary", "date": "date", "time without time zone": "string", "time with time zone": "string",
    "timestamp without time zone": "timestamp", "timestamp with time zone": "timestamptz",
    "interval": "struct<months: int, days: int, microseconds: long>",
    "uuid": "string", "json": "string", "jsonb": "string", "inet": "string", "cidr": "string", "macaddr": "string",
    "macaddr8": "string", "integer[]": "list<int>", "int4range": "string", "money": "string",
}


@pytest.mark.parametrize("declared", sorted(EXPECTED))
def test_each_postgresql_type_has_its_iceberg_type(declared: str) -> None:
    pg = type_from_name(declared) if "(5,-2)" not in declared else PgType("numeric", declared, 5, -2)
    found = re.sub(r"\d+: |optional ", "", str(iceberg_type(arrow_type(pg))))
    assert found.replace("element: ", "") == EXPECTED[declared]
    current = Schema(NestedField(1, "c", iceberg_type(arrow_type(pg)), required=False))
    assert type_changes(current, pa.schema([pa.field("c", arrow_type(pg))])) == []  # read back: the same type


def test_every_kind_maps() -> None:
    covered = {type_from_name(d).kind if "(5,-2)" not in d else "numeric" for d in EXPECTED}
    assert covered | {"exact"} >= set(KINDS) - {"array"} | {"array"}


def test_promotions_are_iceberg_s_and_nothing_else() -> None:
    assert promotable(IntegerType(), LongType()) and promotable(DecimalType(10, 2), DecimalType(14, 2))
    assert not promotable(LongType(), IntegerType()) and not promotable(DecimalType(10, 2), DecimalType(12, 3))
    assert not promotable(DecimalType(10, 2), StringType()) and not promotable(IntegerType(), StringType())
    current = Schema(NestedField(1, "id", IntegerType(), required=False), NestedField(2, "n", DecimalType(10, 2), required=False))
    changes = type_changes(current, pa.schema([("id", pa.int64()), ("n", pa.string()), ("new", pa.string())]))
    assert [(c.column, c.allowed) for c in changes] == [("id", True), ("n", False)]
    assert [c.column for c in refused_changes(changes)] == ["n"]


def test_read_back_types_become_the_state_s_again() -> None:
    state = pa.schema([("s", pa.int16()), ("l", pa.list_(pa.int32())), ("m", pa.map_(pa.string(), pa.string()))])
    read = pa.table({"s": pa.array([1, None], pa.int32()), "l": pa.array([[1], None], pa.list_(pa.field("element", pa.int32()))),
                     "m": pa.array([[("a", "b")], None], pa.map_(pa.string(), pa.string()))})
    assert to_state_types(read, state).schema == state
    assert all(f.nullable for f in nullable_schema(pa.schema([pa.field("k", pa.int32(), False)])))
