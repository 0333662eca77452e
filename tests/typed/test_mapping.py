"""pgpoll.typed.mapping: the PostgreSQL -> Arrow / Spark table, without a database."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgpoll.typed.mapping import (
    INTERVAL_STRUCT,
    KINDS,
    PgType,
    arrow_type,
    decimal_shape,
    spark_ddl,
    type_from_name,
    type_from_oid,
    type_tag,
)


def _numeric_typmod(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


# ---- type_from_name: test_decoding's format_type_be text ----------------------------------

NAMES: list[tuple[str, str, int | None, int | None]] = [
    ("boolean", "bool", None, None),
    ("smallint", "int2", None, None),
    ("integer", "int4", None, None),
    ("bigint", "int8", None, None),
    ("oid", "oid", None, None),
    ("real", "float4", None, None),
    ("double precision", "float8", None, None),
    ("numeric", "numeric", None, None),
    ("numeric(10,2)", "numeric", 10, 2),
    ("numeric(7)", "numeric", 7, 0),
    ("numeric(5,-2)", "numeric", 5, -2),
    ("text", "text", None, None),
    ("character varying", "text", None, None),
    ("character varying(20)", "text", None, None),
    ("character", "text", None, None),
    ("character(5)", "text", None, None),
    ("bpchar", "text", None, None),
    ("name", "text", None, None),
    ('"char"', "text", None, None),
    ("bytea", "bytea", None, None),
    ("date", "date", None, None),
    ("time without time zone", "time", None, None),
    ("time(3) without time zone", "time", None, None),
    ("time with time zone", "timetz", None, None),
    ("time(0) with time zone", "timetz", None, None),
    ("timestamp without time zone", "timestamp", None, None),
    ("timestamp(3) without time zone", "timestamp", None, None),
    ("timestamp with time zone", "timestamptz", None, None),
    ("timestamp(3) with time zone", "timestamptz", None, None),
    ("interval", "interval", None, None),
    ("interval(3)", "interval", None, None),
    ("interval year to month", "interval", None, None),
    ("interval day to second(3)", "interval", None, None),
    ("interval hour", "interval", None, None),
    ("uuid", "uuid", None, None),
    ("json", "json", None, None),
    ("jsonb", "jsonb", None, None),
    ("inet", "inet", None, None),
    ("cidr", "cidr", None, None),
    ("macaddr", "macaddr", None, None),
    ("macaddr8", "macaddr8", None, None),
    # exact
    ("mood", "exact", None, None),
    ("public.mood", "exact", None, None),
    ('"My Type"', "exact", None, None),
    ("int4range", "exact", None, None),
    ("money", "exact", None, None),
    ("xml", "exact", None, None),
    ("bit", "exact", None, None),
    ("bit(3)", "exact", None, None),
    ("bit varying(5)", "exact", None, None),
    ("tsvector", "exact", None, None),
    ("box[]", "exact", None, None),
    ("int4", "exact", None, None),  # not format_type text: a user type of that name
    ("timestamptz", "exact", None, None),
    ("numeric(10,2", "exact", None, None),
]


@pytest.mark.parametrize("name,kind,precision,scale", NAMES)
def test_type_from_name(name: str, kind: str, precision: int | None, scale: int | None) -> None:
    t = type_from_name(name)
    assert (t.kind, t.declared, t.precision, t.scale) == (kind, name, precision, scale)
    assert t.element is None


@pytest.mark.parametrize("name,kind,precision,scale", [n for n in NAMES if n[0] != "box[]"])
def test_type_from_name_arrays(name: str, kind: str, precision: int | None, scale: int | None) -> None:
    t = type_from_name(name + "[]")
    assert (t.kind, t.declared) == ("array", name + "[]")
    assert t.element == type_from_name(name)


def test_type_from_name_strips_and_refuses_nested_arrays() -> None:
    assert type_from_name(" integer ") == PgType("int4", "integer")
    assert type_from_name("integer[][]") == PgType("exact", "integer[][]")


# ---- type_from_oid: pgoutput's Relation columns -----------------------------------------

OIDS: list[tuple[int, int, str, str]] = [
    (16, -1, "bool", "boolean"),
    (17, -1, "bytea", "bytea"),
    (18, -1, "text", '"char"'),
    (19, -1, "text", "name"),
    (20, -1, "int8", "bigint"),
    (21, -1, "int2", "smallint"),
    (23, -1, "int4", "integer"),
    (25, -1, "text", "text"),
    (26, -1, "oid", "oid"),
    (114, -1, "json", "json"),
    (650, -1, "cidr", "cidr"),
    (700, -1, "float4", "real"),
    (701, -1, "float8", "double precision"),
    (774, -1, "macaddr8", "macaddr8"),
    (829, -1, "macaddr", "macaddr"),
    (869, -1, "inet", "inet"),
    (1042, 9, "text", "character(5)"),
    (1042, -1, "text", "character"),
    (1043, 24, "text", "character varying(20)"),
    (1043, -1, "text", "character varying"),
    (1082, -1, "date", "date"),
    (1083, -1, "time", "time without time zone"),
    (1083, 3, "time", "time(3) without time zone"),
    (1114, -1, "timestamp", "timestamp without time zone"),
    (1184, 3, "timestamptz", "timestamp(3) with time zone"),
    (1186, -1, "interval", "interval"),
    (1266, -1, "timetz", "time with time zone"),
    (1700, -1, "numeric", "numeric"),
    (1700, _numeric_typmod(10, 2), "numeric", "numeric(10,2)"),
    (2950, -1, "uuid", "uuid"),
    (3802, -1, "jsonb", "jsonb"),
    # kept exact
    (142, -1, "exact", "xml"),
    (790, -1, "exact", "money"),
    (1560, 3, "exact", "bit(3)"),
    (1562, -1, "exact", "bit varying"),
    (3614, -1, "exact", "tsvector"),
    (3904, -1, "exact", "int4range"),
    (1020, -1, "exact", "box[]"),
    (2205, -1, "exact", "unknown type 2205"),  # regclass: built in, not in the table
    (99999, -1, "exact", "unknown type 99999"),
]


@pytest.mark.parametrize("oid,typmod,kind,declared", OIDS)
def test_type_from_oid(oid: int, typmod: int, kind: str, declared: str) -> None:
    t = type_from_oid(oid, typmod)
    assert (t.kind, t.declared) == (kind, declared)


ARRAYS = {
    1000: "bool", 1005: "int2", 1007: "int4", 1016: "int8", 1009: "text", 1015: "text", 1014: "text",
    1021: "float4", 1022: "float8", 1231: "numeric", 1182: "date", 1115: "timestamp", 1185: "timestamptz",
    2951: "uuid", 3807: "jsonb", 199: "json", 1001: "bytea", 1187: "interval", 1183: "time", 1270: "timetz",
    1041: "inet", 651: "cidr", 1040: "macaddr", 775: "macaddr8", 1028: "oid", 1002: "text", 1003: "text",
    791: "exact", 3905: "exact", 1561: "exact",
}


@pytest.mark.parametrize("oid,element_kind", sorted(ARRAYS.items()))
def test_type_from_oid_arrays(oid: int, element_kind: str) -> None:
    t = type_from_oid(oid, -1)
    assert t.kind == "array" and t.element is not None
    assert t.element.kind == element_kind
    assert t.declared == t.element.declared + "[]"


def test_numeric_typmods() -> None:
    assert type_from_oid(1700, _numeric_typmod(10, 2)) == PgType("numeric", "numeric(10,2)", 10, 2)
    assert type_from_oid(1700, _numeric_typmod(5, -2)) == PgType("numeric", "numeric(5,-2)", 5, -2)
    assert type_from_oid(1700, _numeric_typmod(3, 5)) == PgType("numeric", "numeric(3,5)", 3, 5)
    assert type_from_oid(1700, _numeric_typmod(1000, 0)).precision == 1000
    element = type_from_oid(1231, _numeric_typmod(12, 3)).element
    assert element == PgType("numeric", "numeric(12,3)", 12, 3)


def test_type_messages() -> None:
    names = {
        20001: ("pg_catalog", "int4"),  # a domain over int4: the Type message names the base type
        20002: ("public", "mood"),
        20003: ("public", "_mood"),
        20004: ("pg_catalog", "_int4"),  # a domain over integer[]
        20005: ("My Schema", "My Type"),
        20006: ("pg_catalog", "numeric"),  # a domain over numeric(10,2): the column's typmod is -1
        20007: ("pg_catalog", "_box"),
    }
    assert type_from_oid(20001, -1, names) == PgType("int4", "integer")
    assert type_from_oid(20002, -1, names) == PgType("exact", "public.mood")
    assert type_from_oid(20003, -1, names) == PgType("array", "public.mood[]", element=PgType("exact", "public.mood"))
    assert type_from_oid(20004, -1, names) == PgType("array", "integer[]", element=PgType("int4", "integer"))
    assert type_from_oid(20005, -1, names) == PgType("exact", '"My Schema"."My Type"')
    assert type_from_oid(20006, -1, names) == PgType("numeric", "numeric")
    assert type_from_oid(20007, -1, names).kind == "exact"
    assert type_from_oid(20008, -1, names).kind == "exact"
    assert type_from_oid(23, -1, {23: ("public", "whatever")}) == PgType("int4", "integer")  # built-ins win


# ---- PgType -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t",
    [
        PgType("int4", "integer"),
        PgType("numeric", "numeric(10,2)", 10, 2),
        PgType("numeric", "numeric(5,-2)", 5, -2),
        PgType("array", "numeric(10,2)[]", element=PgType("numeric", "numeric(10,2)", 10, 2)),
        PgType("array", "public.mood[]", element=PgType("exact", "public.mood")),
        PgType("exact", '"My Type"'),
    ],
)
def test_json_round_trip(t: PgType) -> None:
    d = t.to_json()
    assert PgType.from_json(d) == t
    assert all(v is not None for v in d.values())


def test_to_json_shape() -> None:
    assert PgType("int4", "integer").to_json() == {"kind": "int4", "declared": "integer"}
    assert type_from_name("numeric(10,2)[]").to_json() == {
        "kind": "array",
        "declared": "numeric(10,2)[]",
        "element": {"kind": "numeric", "declared": "numeric(10,2)", "precision": 10, "scale": 2},
    }


def test_pgtype_validates() -> None:
    with pytest.raises(ValueError):
        PgType("integer", "integer")
    with pytest.raises(ValueError):
        PgType("array", "integer[]")
    with pytest.raises(ValueError):
        PgType("int4", "integer", element=PgType("int4", "integer"))
    with pytest.raises(ValueError):
        PgType.from_json({"kind": "nope", "declared": "x"})


# ---- Arrow, Spark, tags --------------------------------------------------------------------

ARROW: list[tuple[str, pa.DataType, str, str]] = [
    ("boolean", pa.bool_(), "boolean", "boolean"),
    ("smallint", pa.int16(), "smallint", "smallint"),
    ("integer", pa.int32(), "int", "int"),
    ("bigint", pa.int64(), "bigint", "bigint"),
    ("oid", pa.int64(), "bigint", "bigint"),
    ("real", pa.float32(), "float", "float"),
    ("double precision", pa.float64(), "double", "double"),
    ("numeric(10,2)", pa.decimal128(10, 2), "decimal(10,2)", "decimal_10_2"),
    ("numeric(38,0)", pa.decimal128(38, 0), "decimal(38,0)", "decimal_38_0"),
    ("numeric(5,-2)", pa.decimal128(7, 0), "decimal(7,0)", "decimal_7_0"),
    ("numeric(3,5)", pa.decimal128(5, 5), "decimal(5,5)", "decimal_5_5"),
    ("numeric(38,-1)", pa.string(), "string", "string"),
    ("numeric(39,2)", pa.string(), "string", "string"),
    ("numeric", pa.string(), "string", "string"),
    ("text", pa.string(), "string", "string"),
    ("character(5)", pa.string(), "string", "string"),
    ("bytea", pa.binary(), "binary", "binary"),
    ("date", pa.date32(), "date", "date"),
    ("time without time zone", pa.string(), "string", "string"),
    ("time with time zone", pa.string(), "string", "string"),
    ("timestamp without time zone", pa.timestamp("us"), "timestamp_ntz", "timestamp_ntz"),
    ("timestamp with time zone", pa.timestamp("us", tz="UTC"), "timestamp", "timestamp"),
    ("interval", INTERVAL_STRUCT, "struct<months:int,days:int,microseconds:bigint>", "interval"),
    ("uuid", pa.string(), "string", "string"),
    ("json", pa.string(), "string", "string"),
    ("jsonb", pa.string(), "string", "string"),
    ("inet", pa.string(), "string", "string"),
    ("cidr", pa.string(), "string", "string"),
    ("macaddr", pa.string(), "string", "string"),
    ("macaddr8", pa.string(), "string", "string"),
    ("mood", pa.string(), "string", "string"),
    ("integer[]", pa.list_(pa.int32()), "array<int>", "array_int"),
    ("numeric(10,2)[]", pa.list_(pa.decimal128(10, 2)), "array<decimal(10,2)>", "array_decimal_10_2"),
    ("interval[]", pa.list_(INTERVAL_STRUCT), "array<struct<months:int,days:int,microseconds:bigint>>",
     "array_interval"),
    ("timestamp without time zone[]", pa.list_(pa.timestamp("us")), "array<timestamp_ntz>", "array_timestamp_ntz"),
    ("public.mood[]", pa.list_(pa.string()), "array<string>", "array_string"),
]


@pytest.mark.parametrize("name,arrow,ddl,tag", ARROW)
def test_arrow_spark_tag(name: str, arrow: pa.DataType, ddl: str, tag: str) -> None:
    t = type_from_name(name)
    assert arrow_type(t) == arrow
    assert spark_ddl(t) == ddl
    assert type_tag(t) == tag
    assert tag.isidentifier()


def test_every_kind_has_an_arrow_type() -> None:
    for kind in KINDS:
        t = PgType(kind, kind, element=PgType("int4", "integer") if kind == "array" else None)
        assert isinstance(arrow_type(t), pa.DataType)
        assert spark_ddl(t)


def test_decimal_shape() -> None:
    assert decimal_shape(PgType("numeric", "numeric")) is None
    assert decimal_shape(PgType("numeric", "numeric(1,0)", 1, 0)) == (1, 0)
    assert decimal_shape(PgType("numeric", "numeric(38,38)", 38, 38)) == (38, 38)
    assert decimal_shape(PgType("numeric", "numeric(2,40)", 2, 40)) is None
    assert decimal_shape(PgType("int4", "integer")) is None
