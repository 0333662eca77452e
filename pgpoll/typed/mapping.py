"""The one table mapping PostgreSQL types to Arrow and Spark types.

A column's type is described by a :class:`PgType`, built from what the slot's
stream says about it:

* pgoutput -- :func:`type_from_oid` with the Relation message's type OID and
  typmod, and the decoder's Type-message cache for OIDs >= 10000;
* test_decoding -- :func:`type_from_name` with the printed type name
  (``format_type_be`` text: test_decoding prints **no typmod**, so a
  ``numeric(10,2)`` column arrives as ``numeric``; a catalog query with
  ``format_type(atttypid, atttypmod)`` gives names with typmods, which
  :func:`type_from_name` reads too).

The mapping (values are the type's output-function text under pgpoll's pinned
settings; "fallback" means the typed column holds null for that row and the
exact text is kept elsewhere):

| PostgreSQL | Arrow | Spark | Fallback (typed slot null) |
|---|---|---|---|
| boolean | bool | boolean | - |
| smallint | int16 | smallint | - |
| integer | int32 | int | - |
| bigint, oid | int64 | bigint | - |
| real | float32 | float | - (NaN, Infinity, -Infinity are floats) |
| double precision | float64 | double | - (NaN, Infinity, -Infinity are floats) |
| numeric(p,s), 1 <= p <= 38 | decimal128(p,s) | decimal(p,s) | NaN, Infinity, -Infinity |
| numeric(p,s), s < 0 | decimal128(p-s,0) | decimal(p-s,0) | as above; string if p-s > 38 |
| numeric(p,s), s > p | decimal128(s,s) | decimal(s,s) | as above; string if s > 38 |
| numeric, numeric(p > 38) | string (exact text) | string | - (NaN, Infinity kept as text) |
| text, varchar, char(n), name, "char" | string | string | - (char(n) keeps its padding) |
| bytea | binary | binary | text not in hex format |
| date | date32 | date | infinity, -infinity, BC, year > 9999 |
| time, timetz | string (exact text) | string | - (Spark cannot read Parquet TIME) |
| timestamp | timestamp[us] | timestamp_ntz | infinity, -infinity, BC, year > 9999 |
| timestamptz | timestamp[us, UTC] | timestamp | infinity, -infinity, BC, year > 9999 |
| interval | struct<months int32, days int32, microseconds int64> | same (int, int, bigint) | infinity, -infinity (PG 17+) |
| uuid, json, jsonb, inet, cidr, macaddr, macaddr8 | string | string | - |
| T[] of a typed T | list<arrow(T)> | array<spark(T)> | not 1-D, explicit bounds, an element T cannot hold |
| T[] of an exact T | list<string> (element texts) | array<string> | not 1-D, explicit bounds |
| anything else, "exact" (see below) | string (exact text) | string | - |

"Exact" types include enums, ranges, composites, money, xml, bit, varbit, tsvector, box[] and unknown OIDs.

Domains: pgoutput's Type message names the domain's *base* type
(``logicalrep_write_typ`` calls ``getBaseType``), so a domain over ``int4``
maps like ``int4``; its column typmod is -1 (a domain's typmod lives in
``pg_type.typtypmod``), so a domain over ``numeric(10,2)`` maps like
``numeric``. test_decoding prints the domain's own name: ``exact``.
An array of a user type arrives as ``_name``; its elements are ``exact``
unless the name is a ``pg_catalog`` base type's. Arrays of ``box`` (the one
built-in type whose array delimiter is ``;``) are ``exact`` as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "INTERVAL_STRUCT",
    "KINDS",
    "PgType",
    "arrow_type",
    "decimal_shape",
    "spark_ddl",
    "type_from_name",
    "type_from_oid",
    "type_tag",
]

#: Every canonical kind, in documentation order.
KINDS = (
    "bool", "int2", "int4", "int8", "oid", "float4", "float8", "numeric", "text", "bytea", "date", "time",
    "timetz", "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb", "inet", "cidr", "macaddr",
    "macaddr8", "array", "exact",
)

#: Arrow type of an interval: PostgreSQL's own three fields, never justified.
INTERVAL_STRUCT = pa.struct([("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())])


@dataclass(frozen=True)
class PgType:
    """A column's PostgreSQL type, reduced to what the mapping needs.

    ``kind`` is one of :data:`KINDS`; ``declared`` the type as PostgreSQL
    names it (``format_type`` style: ``numeric(10,2)``, ``integer[]``);
    ``precision``/``scale`` the numeric typmod (``None`` when unconstrained);
    ``element`` the element type of an ``array``.
    """

    kind: str
    declared: str
    precision: int | None = None
    scale: int | None = None
    element: PgType | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown PgType kind {self.kind!r}")
        if (self.kind == "array") != (self.element is not None):
            raise ValueError("a PgType has an element exactly when its kind is 'array'")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; keys that are ``None`` are left out."""
        out: dict[str, Any] = {"kind": self.kind, "declared": self.declared}
        if self.precision is not None:
            out["precision"] = self.precision
        if self.scale is not None:
            out["scale"] = self.scale
        if self.element is not None:
            out["element"] = self.element.to_json()
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PgType:
        """The inverse of :meth:`to_json`."""
        element = d.get("element")
        return PgType(
            str(d["kind"]),
            str(d["declared"]),
            d.get("precision"),
            d.get("scale"),
            PgType.from_json(element) if element is not None else None,
        )


# ---- the catalog tables -------------------------------------------------------------

#: pg_catalog typname -> (kind, format_type name), for the types the mapping knows.
_TYPNAMES: dict[str, tuple[str, str]] = {
    "bool": ("bool", "boolean"), "int2": ("int2", "smallint"), "int4": ("int4", "integer"),
    "int8": ("int8", "bigint"), "oid": ("oid", "oid"), "float4": ("float4", "real"),
    "float8": ("float8", "double precision"), "numeric": ("numeric", "numeric"), "text": ("text", "text"),
    "varchar": ("text", "character varying"), "bpchar": ("text", "character"), "name": ("text", "name"),
    "char": ("text", '"char"'), "bytea": ("bytea", "bytea"), "date": ("date", "date"),
    "time": ("time", "time without time zone"), "timetz": ("timetz", "time with time zone"),
    "timestamp": ("timestamp", "timestamp without time zone"),
    "timestamptz": ("timestamptz", "timestamp with time zone"), "interval": ("interval", "interval"),
    "uuid": ("uuid", "uuid"), "json": ("json", "json"), "jsonb": ("jsonb", "jsonb"), "inet": ("inet", "inet"),
    "cidr": ("cidr", "cidr"), "macaddr": ("macaddr", "macaddr"), "macaddr8": ("macaddr8", "macaddr8"),
    # kept exact, named so that `declared` reads well
    "bit": ("exact", "bit"), "varbit": ("exact", "bit varying"), "money": ("exact", "money"),
    "xml": ("exact", "xml"), "tsvector": ("exact", "tsvector"), "tsquery": ("exact", "tsquery"),
    "int4range": ("exact", "int4range"), "int8range": ("exact", "int8range"), "numrange": ("exact", "numrange"),
    "tsrange": ("exact", "tsrange"), "tstzrange": ("exact", "tstzrange"), "daterange": ("exact", "daterange"),
    "point": ("exact", "point"), "box": ("exact", "box"), "pg_lsn": ("exact", "pg_lsn"),
    "jsonpath": ("exact", "jsonpath"),
}

#: Built-in base type OID -> pg_catalog typname (pg_type.dat).
_OIDS: dict[int, str] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4", 25: "text",
    26: "oid", 114: "json", 142: "xml", 600: "point", 603: "box", 650: "cidr", 700: "float4", 701: "float8",
    774: "macaddr8", 790: "money", 829: "macaddr", 869: "inet", 1042: "bpchar", 1043: "varchar", 1082: "date",
    1083: "time", 1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz", 1560: "bit",
    1562: "varbit", 1700: "numeric", 2950: "uuid", 3220: "pg_lsn", 3614: "tsvector", 3615: "tsquery",
    3802: "jsonb", 3904: "int4range", 3906: "numrange", 3908: "tsrange", 3910: "tstzrange",
    3912: "daterange", 3926: "int8range", 4072: "jsonpath",
}

#: Built-in array type OID -> element OID (pg_type.dat's array_type_oid).
_ARRAY_OIDS: dict[int, int] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 1028: 26, 199: 114,
    143: 142, 1017: 600, 1020: 603, 651: 650, 1021: 700, 1022: 701, 775: 774, 791: 790, 1040: 829,
    1041: 869, 1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186,
    1270: 1266, 1561: 1560, 1563: 1562, 1231: 1700, 2951: 2950, 3221: 3220, 3643: 3614, 3645: 3615,
    3807: 3802, 3905: 3904, 3907: 3906, 3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072,
}

#: format_type names (test_decoding's text) without a typmod -> kind.
_NAMES: dict[str, str] = {name: kind for kind, name in _TYPNAMES.values() if kind != "exact"}
_NAMES["bpchar"] = "text"  # format_type(bpchar, -1) with FORMAT_TYPE_TYPEMOD_GIVEN

#: Element types whose arrays print with a delimiter other than ',': the whole array stays exact.
_SEMICOLON_ELEMENTS = frozenset({"box"})

_NUMERIC_RE = re.compile(r"numeric\((\d+)(?:,(-?\d+))?\)")
_LENGTH_RE = re.compile(r"(character varying|character|bit varying|bit)\(\d+\)")
_DATETIME_RE = re.compile(r"(time|timestamp)(?:\(\d\))? (with|without) time zone")
_INTERVAL_RE = re.compile(r"interval(?:\(\d\))?(?: (?:year|month|day|hour|minute|second)(?: to \w+)?(?:\(\d\))?)?")
_PRECISION_TYPES = {"time", "timetz", "timestamp", "timestamptz"}


def _numeric_typmod(typmod: int) -> tuple[int | None, int | None]:
    """numeric's typmod -> (precision, scale); ``(None, None)`` for -1 (unconstrained).

    ``typmod = ((precision << 16) | (scale & 0x7ff)) + VARHDRSZ``; since
    PostgreSQL 15 the scale is an 11-bit signed field (it may be negative).
    """
    if typmod < 4:
        return None, None
    raw = typmod - 4
    return (raw >> 16) & 0xFFFF, ((raw & 0x7FF) ^ 1024) - 1024


def _declared(typname: str, name: str, typmod: int) -> str:
    """format_type(oid, typmod) for a pg_catalog type of :data:`_TYPNAMES`."""
    if typmod < 0:
        return name
    if typname == "numeric":
        p, s = _numeric_typmod(typmod)
        return name if p is None else f"numeric({p},{s})"
    if typname in ("varchar", "bpchar") and typmod >= 4:
        return f"{name}({typmod - 4})"
    if typname in ("bit", "varbit"):
        return f"{name}({typmod})"
    if typname in _PRECISION_TYPES:
        base, _, rest = name.partition(" ")
        return f"{base}({typmod}) {rest}"
    return name


def _catalog_type(typname: str, typmod: int) -> PgType:
    kind, name = _TYPNAMES[typname]
    declared = _declared(typname, name, typmod)
    if kind == "numeric":
        p, s = _numeric_typmod(typmod)
        return PgType(kind, declared, p, s)
    return PgType(kind, declared)


def _array_of(element: PgType, element_typname: str = "") -> PgType:
    declared = element.declared + "[]"
    if element.kind == "array" or element_typname in _SEMICOLON_ELEMENTS:
        return PgType("exact", declared)
    return PgType("array", declared, element=element)


def _quote_ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _named_type(schema: str, typname: str, typmod: int) -> PgType:
    """A type named by a Type message (schema, typname)."""
    if schema == "pg_catalog":
        if typname in _TYPNAMES:
            return _catalog_type(typname, typmod)
        if typname.startswith("_") and typname[1:] in _TYPNAMES:
            return _array_of(_catalog_type(typname[1:], typmod), typname[1:])
    qualified = f"{_quote_ident(schema)}.{_quote_ident(typname)}"
    if typname.startswith("_") and len(typname) > 1:
        return PgType("array", f"{_quote_ident(schema)}.{_quote_ident(typname[1:])}[]",
                      element=PgType("exact", f"{_quote_ident(schema)}.{_quote_ident(typname[1:])}"))
    return PgType("exact", qualified)


def type_from_oid(type_oid: int, typmod: int, type_names: Mapping[int, tuple[str, str]] = {}) -> PgType:
    """The :class:`PgType` of a pgoutput Relation column (type OID and typmod).

    Built-in OIDs come from a static table; others from ``type_names``
    (OID -> (schema, type name), the decoder's ``types``, filled from Type
    messages). An OID found in neither is ``exact``.
    """
    typname = _OIDS.get(type_oid)
    if typname is not None:
        return _catalog_type(typname, typmod)
    element_oid = _ARRAY_OIDS.get(type_oid)
    if element_oid is not None:
        element_name = _OIDS[element_oid]
        return _array_of(_catalog_type(element_name, typmod), element_name)
    named = type_names.get(type_oid)
    if named is not None:
        return _named_type(named[0], named[1], typmod)
    return PgType("exact", f"unknown type {type_oid}")


def type_from_name(declared: str) -> PgType:
    """The :class:`PgType` of a ``format_type`` name (test_decoding's column type).

    Reads names with or without typmod (``numeric``, ``numeric(10,2)``,
    ``character varying(20)``, ``timestamp(3) with time zone``, ``interval
    year to month``) and ``[]`` arrays of them; anything else is ``exact``.
    """
    name = declared.strip()
    if name.endswith("[]"):
        element_name = name[:-2]
        return _array_of(type_from_name(element_name), element_name)
    kind = _NAMES.get(name)
    if kind is not None:
        return PgType(kind, name)
    m = _NUMERIC_RE.fullmatch(name)
    if m:
        return PgType("numeric", name, int(m.group(1)), int(m.group(2) or 0))
    m = _LENGTH_RE.fullmatch(name)
    if m:
        return PgType("text" if m.group(1).startswith("character") else "exact", name)
    m = _DATETIME_RE.fullmatch(name)
    if m:
        return PgType(m.group(1) + ("tz" if m.group(2) == "with" else ""), name)
    if _INTERVAL_RE.fullmatch(name):
        return PgType("interval", name)
    return PgType("exact", name)


# ---- Arrow and Spark -------------------------------------------------------------------

_ARROW: dict[str, pa.DataType] = {
    "bool": pa.bool_(), "int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "oid": pa.int64(),
    "float4": pa.float32(), "float8": pa.float64(), "text": pa.string(), "bytea": pa.binary(),
    "date": pa.date32(), "time": pa.string(), "timetz": pa.string(), "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"), "interval": INTERVAL_STRUCT, "uuid": pa.string(),
    "json": pa.string(), "jsonb": pa.string(), "inet": pa.string(), "cidr": pa.string(),
    "macaddr": pa.string(), "macaddr8": pa.string(), "exact": pa.string(),
}


def decimal_shape(t: PgType) -> tuple[int, int] | None:
    """The Arrow (precision, scale) holding a constrained numeric, or ``None`` (string).

    ``numeric(p,s)`` with ``0 <= s <= p`` is ``(p, s)``; a negative scale
    (values rounded to tens, hundreds...) is ``(p - s, 0)``; a scale above
    the precision (values below 1) is ``(s, s)``. Wider than 38 digits: ``None``.
    """
    if t.kind != "numeric" or t.precision is None or t.scale is None:
        return None
    p, s = t.precision, t.scale
    if s < 0:
        p, s = p - s, 0
    elif s > p:
        p = s
    return (p, s) if 1 <= p <= 38 else None


def arrow_type(t: PgType) -> pa.DataType:
    """The Arrow type of a column of ``t`` (see the module's table)."""
    if t.kind == "numeric":
        shape = decimal_shape(t)
        return pa.decimal128(*shape) if shape else pa.string()
    if t.kind == "array":
        assert t.element is not None
        return pa.list_(arrow_type(t.element))
    return _ARROW[t.kind]


def _spark(at: pa.DataType) -> str:
    if pa.types.is_list(at):
        return f"array<{_spark(at.value_type)}>"
    if pa.types.is_struct(at):
        return "struct<" + ",".join(f"{f.name}:{_spark(f.type)}" for f in at) + ">"
    if pa.types.is_decimal(at):
        return f"decimal({at.precision},{at.scale})"
    if pa.types.is_timestamp(at):
        return "timestamp" if at.tz else "timestamp_ntz"
    return _SPARK[at]


_SPARK: dict[pa.DataType, str] = {
    pa.bool_(): "boolean", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
    pa.float32(): "float", pa.float64(): "double", pa.string(): "string", pa.binary(): "binary",
    pa.date32(): "date",
}


def spark_ddl(t: PgType) -> str:
    """The Spark SQL type of a column of ``t``: ``int``, ``decimal(10,2)``, ``array<int>``..."""
    return _spark(arrow_type(t))


def type_tag(t: PgType) -> str:
    """A short identifier-safe tag of the Spark type: ``int``, ``decimal_10_2``, ``array_int``, ``interval``."""
    ddl = spark_ddl(t).replace(_spark(INTERVAL_STRUCT), "interval")
    return re.sub(r"[^a-z0-9]+", "_", ddl).strip("_")
