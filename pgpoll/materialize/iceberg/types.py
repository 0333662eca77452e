"""PostgreSQL types in an Iceberg table: the mapping, the schema changes Iceberg allows, reading back (pure).

The state's columns have the Arrow types of :mod:`pgpoll.typed.mapping`; each
becomes the Iceberg type below (the same values: what one format holds the
others hold, and what a typed column cannot hold is the exact text in
``_untyped``, as in every format):

================================  =============================================  ==================================
PostgreSQL                        Arrow (the state)                              Iceberg
================================  =============================================  ==================================
boolean                           bool                                           boolean
smallint, integer                 int16, int32                                   int (Iceberg has no 16-bit integer:
                                                                                 smallint reads back as int)
bigint, oid                       int64                                          long
real, double precision            float32, float64                               float, double
numeric(p,s), p <= 38             decimal128(p,s) (negative scale or s > p       decimal(p,s)
                                  widened as in the typed tables)
numeric, numeric(p > 38)          string (the exact text)                        string
text, varchar, char, name, enum   string                                         string
bytea                             binary                                         binary
date                              date32                                         date
time, timetz                      string (the exact text)                        string
timestamp                         timestamp[us]                                  timestamp
timestamptz                       timestamp[us, UTC]                             timestamptz
interval                          struct<months int32, days int32,               struct<months: int, days: int,
                                  microseconds int64>                            microseconds: long>
uuid, json, jsonb, inet, cidr,    string                                         string
macaddr, macaddr8
T[] (one-dimensional)             list<T>                                        list<T> (optional elements)
ranges, composites, money, xml,   string (the exact text)                        string
bit, varbit, tsvector, unknown
``_untyped``                      map<string, string>                            map<string, string>
``_commit_lsn``, ``_commit_ts``   int64, timestamp[us, UTC]                      long, timestamptz
================================  =============================================  ==================================

Every field is optional (nullable), also list elements, map values and
struct fields: a later change may write a null anywhere. ``uuid`` stays a
string, not Iceberg's ``uuid``: readers hand that type back as 16 raw bytes
or an extension type, and every other pgpoll format holds the text. ``time``
stays text: ``24:00:00`` and ``timetz`` offsets have no Iceberg type.

Schema evolution (``ALTER TABLE`` on the source): a new column is added to
the Iceberg schema (older files read it as null), a dropped one is deleted
from it, and a changed type is applied only where Iceberg allows the
promotion (``int`` to ``long``, ``float`` to ``double``, ``decimal(p,s)`` to
``decimal(p',s)`` with ``p' > p``: :func:`pyiceberg.schema.promote`, the
spec's rules); any other change is refused (:func:`refused_changes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


def nullable(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every nested field (struct fields, list elements, map values) nullable."""
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, nullable(f.type), True) for f in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(pa.field("element", nullable(data_type.value_type), True))
    if pa.types.is_map(data_type):
        item: Any = pa.field("value", nullable(data_type.item_type), True)  # (pyarrow takes a field; the stub says a type)
        mapped: pa.DataType = pa.map_(data_type.key_type, item)
        return mapped
    return data_type


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """The state's Arrow schema as the Iceberg schema is made from: every column and nested field optional."""
    return pa.schema([pa.field(f.name, nullable(f.type), True) for f in schema])


def iceberg_type(data_type: pa.DataType) -> Any:
    """The Iceberg type of a state column's Arrow type (the module's table; ValueError for a type pgpoll never
    writes). Nested fields get ids 0; only types are compared with them."""
    from pyiceberg import types as t

    primitives: list[tuple[Any, Any]] = [
        (pa.types.is_boolean, t.BooleanType()), (pa.types.is_int8, t.IntegerType()), (pa.types.is_int16, t.IntegerType()),
        (pa.types.is_int32, t.IntegerType()), (pa.types.is_int64, t.LongType()), (pa.types.is_float32, t.FloatType()),
        (pa.types.is_float64, t.DoubleType()), (pa.types.is_string, t.StringType()), (pa.types.is_large_string, t.StringType()),
        (pa.types.is_binary, t.BinaryType()), (pa.types.is_large_binary, t.BinaryType()), (pa.types.is_date32, t.DateType()),
    ]
    for test, found in primitives:
        if test(data_type):
            return found
    if pa.types.is_decimal(data_type):
        return t.DecimalType(data_type.precision, data_type.scale)
    if pa.types.is_timestamp(data_type):
        return t.TimestamptzType() if data_type.tz else t.TimestampType()
    if pa.types.is_struct(data_type):
        return t.StructType(*[t.NestedField(0, f.name, iceberg_type(f.type), required=False) for f in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return t.ListType(0, iceberg_type(data_type.value_type), element_required=False)
    if pa.types.is_map(data_type):
        return t.MapType(0, iceberg_type(data_type.key_type), 0, iceberg_type(data_type.item_type), value_required=False)
    raise ValueError(f"no Iceberg type for the Arrow type {data_type}")


def same_type(a: Any, b: Any) -> bool:
    """Whether two Iceberg types are the same, field ids aside."""
    from pyiceberg import types as t

    if isinstance(a, t.StructType) and isinstance(b, t.StructType):
        return [f.name for f in a.fields] == [f.name for f in b.fields] and all(
            same_type(x.field_type, y.field_type) for x, y in zip(a.fields, b.fields, strict=True))
    if isinstance(a, t.ListType) and isinstance(b, t.ListType):
        return same_type(a.element_type, b.element_type)
    if isinstance(a, t.MapType) and isinstance(b, t.MapType):
        return same_type(a.key_type, b.key_type) and same_type(a.value_type, b.value_type)
    return bool(a == b)


def promotable(old: Any, new: Any) -> bool:
    """Whether Iceberg allows changing a column from ``old`` to ``new`` (the same type, or a spec promotion)."""
    from pyiceberg.exceptions import ResolveError
    from pyiceberg.schema import promote
    from pyiceberg.types import DecimalType, PrimitiveType

    if same_type(old, new):
        return True
    if not isinstance(old, PrimitiveType) or not isinstance(new, PrimitiveType):
        return False
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        # the spec: precision may grow, the scale stays (pyiceberg 0.12's promote compares the old scale with itself)
        return new.precision >= old.precision and new.scale == old.scale
    try:
        promote(old, new)
    except ResolveError:
        return False
    return True


@dataclass(frozen=True)
class TypeChange:
    """A column whose Iceberg type the new state changes."""

    column: str
    old: str
    new: str
    allowed: bool


def type_changes(current: Any, schema: pa.Schema) -> list[TypeChange]:
    """The columns of the Iceberg schema ``current`` whose type the state's Arrow ``schema`` changes."""
    out: list[TypeChange] = []
    for f in schema:
        try:
            old = current.find_field(f.name, case_sensitive=True).field_type
        except ValueError:
            continue  # a new column
        new = iceberg_type(f.type)
        if not same_type(old, new):
            out.append(TypeChange(f.name, str(old), str(new), promotable(old, new)))
    return out


def refused_changes(changes: Sequence[TypeChange]) -> list[TypeChange]:
    """The changes Iceberg does not allow."""
    return [c for c in changes if not c.allowed]


def to_state_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (read back from Iceberg) with each column that has the same Iceberg type as in ``schema`` cast
    to the state's Arrow type (``int`` back to int16 for smallint, list items named as the state names them);
    other columns are left as read (a changed type: the caller decides)."""
    arrays = []
    for f in table.schema:
        column = table.column(f.name)
        if f.name in schema.names:
            want = schema.field(f.name).type
            if not column.type.equals(want) and same_type(iceberg_type(column.type), iceberg_type(want)):
                column = column.cast(want)
        arrays.append(column)
    return pa.Table.from_arrays(arrays, names=table.column_names)
