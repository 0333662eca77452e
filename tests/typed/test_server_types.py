"""Typed values against a real server: both plugins, edge-case values of every kind.

For each case a table ``(id int, v TYPE)`` gets one row per literal and a
NULL row. Both plugins' changes are decoded; the column's :class:`PgType` is
built from what the stream says (pgoutput: OID, typmod and Type messages;
test_decoding: the printed type name) and the texts are converted with
:func:`to_arrow` and :func:`parse_value`. The oracle is psycopg2's own
adaptation of ``SELECT <oracle> FROM t WHERE id = ...`` (a different
expression where psycopg2 cannot adapt the type), compared through
:mod:`pgpoll.testing.value_compare`. Fallback rows must be exactly the
expected ones, null in the array, with the text PostgreSQL prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2 import sql

from pgpoll.changes import RowChange
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.decode.text_decoder import TestDecodingDecoder
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.slots import create_slot, peek_options, peek_rows
from pgpoll.testing.value_compare import comparable_lake, comparable_source
from pgpoll.typed.conversions import Unrepresentable, parse_value, to_arrow
from pgpoll.typed.mapping import PgType, type_from_name, type_from_oid

_INTERVAL_PARTS = (
    "ARRAY[(extract(year from v) * 12 + extract(month from v))::bigint, extract(day from v)::bigint,"
    " (extract(hour from v) * 3600000000 + extract(minute from v) * 60000000"
    " + extract(microseconds from v))::bigint]"
)


@dataclass(frozen=True)
class Case:
    """One column type, its literals, and what each plugin must make of them."""

    sql_type: str
    literals: tuple[str, ...]
    kinds: tuple[str, str]  # (pgoutput kind, test_decoding kind)
    fallbacks: frozenset[int] = frozenset()  # literal indexes, pgoutput
    td_fallbacks: frozenset[int] | None = None  # test_decoding (None: same as pgoutput)
    oracle: str = "v"
    declared: tuple[str, str] = ("", "")  # expected `declared`, when given


def _f(*indexes: int) -> frozenset[int]:
    return frozenset(indexes)


CASES: list[Case] = [
    Case("boolean", ("true", "false"), ("bool", "bool")),
    Case("smallint", ("-32768", "32767", "0"), ("int2", "int2")),
    Case("integer", ("-2147483648", "2147483647"), ("int4", "int4")),
    Case("bigint", ("-9223372036854775808", "9223372036854775807"), ("int8", "int8")),
    Case("oid", ("0", "4294967295"), ("oid", "oid")),
    Case("real", ("1.1", "-3.4028235e38", "1e-45", "NaN", "Infinity", "-Infinity", "-0"), ("float4", "float4")),
    Case("double precision", ("0.1", "1.7976931348623157e308", "5e-324", "NaN", "Infinity", "-Infinity"),
         ("float8", "float8")),
    Case("numeric(10,2)", ("12345678.91", "-0.01", "0", "NaN", "1.005"), ("numeric", "numeric"), _f(3), _f(),
         declared=("numeric(10,2)", "numeric")),
    Case("numeric(38,0)", ("99999999999999999999999999999999999999", "-1"), ("numeric", "numeric")),
    Case("numeric(3,5)", ("0.00123", "-0.00999"), ("numeric", "numeric")),
    Case("numeric(5,-2)", ("12345", "-9999949"), ("numeric", "numeric")),
    Case("numeric(40,2)", ("12345678901234567890123456789012345678.12",), ("numeric", "numeric")),
    Case("numeric", ("NaN", "Infinity", "-Infinity", "1e-300", "123456789012345678901234567890.123456789"),
         ("numeric", "numeric")),
    Case("text", ("", "ünï ☃ 🎉", 'a"b\\c', "NULL", " space ", "{1,2}", "line\nbreak"), ("text", "text")),
    Case("character varying(20)", ("abc", ""), ("text", "text"),
         declared=("character varying(20)", "character varying")),
    Case("character(5)", ("ab", ""), ("text", "text"), declared=("character(5)", "character")),
    Case("name", ("pg_class",), ("text", "text")),
    Case('"char"', ("x",), ("text", "text")),
    Case("bytea", ("\\x00ff00", "\\x", "\\x000000"), ("bytea", "bytea")),
    Case("date", ("2024-02-29", "0001-01-01", "9999-12-31", "infinity", "-infinity", "0044-03-15 BC",
                  "10000-01-01"), ("date", "date"), _f(3, 4, 5, 6)),
    Case("time", ("04:05:06.789", "00:00:00", "23:59:59.999999"), ("time", "time")),
    Case("time(2) without time zone", ("24:00:00", "12:00:00.125"), ("time", "time"), oracle="format('%%s', v)",
         declared=("time(2) without time zone", "time without time zone")),
    Case("time with time zone", ("04:05:06.789+05:30", "00:00:00-14:59", "12:00:00+00"), ("timetz", "timetz")),
    Case("timestamp", ("2024-01-02 03:04:05.123456", "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999",
                       "infinity", "-infinity", "2000-01-01 00:00:00 BC", "10000-01-01 00:00:00"),
         ("timestamp", "timestamp"), _f(3, 4, 5, 6)),
    Case("timestamp(3) with time zone", ("2024-01-02 03:04:05.1235+00", "2024-06-01 12:00:00+05:30",
                                         "0001-01-01 00:00:00+00", "infinity", "-infinity",
                                         "1000-01-01 00:00:00+00 BC", "9999-12-31 23:59:59.999+00"),
         ("timestamptz", "timestamptz"), _f(3, 4, 5),
         declared=("timestamp(3) with time zone", "timestamp with time zone")),
    Case("interval", ("1 year 2 mons 3 days 04:05:06.789", "-1 years -2 mons +3 days -04:05:06.789", "0",
                      "-00:00:01", "1 day", "2147483647 days", "-178000000 years", "2562047788 hours",
                      "1 mon -1 sec", "0.000001 sec", "-7 days 2 hours", "13 months -40 days 100:00:00"),
         ("interval", "interval"), oracle=_INTERVAL_PARTS),
    Case("interval year to month", ("1 year 2 months", "-3 months"), ("interval", "interval"),
         oracle=_INTERVAL_PARTS),
    Case("uuid", ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",), ("uuid", "uuid")),
    Case("json", ('{"a": [1, 2.50], "a": null}', '"x"'), ("json", "json")),
    Case("jsonb", ('{"a": [1, 2.50], "b": {"c": "ü"}}', "[]"), ("jsonb", "jsonb")),
    Case("inet", ("192.168.0.1/24", "::1", "10.0.0.1"), ("inet", "inet")),
    Case("cidr", ("10.0.0.0/8",), ("cidr", "cidr")),
    Case("macaddr", ("08:00:2b:01:02:03",), ("macaddr", "macaddr")),
    Case("macaddr8", ("08:00:2b:01:02:03:04:05",), ("macaddr8", "macaddr8")),
    Case("integer[]", ("{1,NULL,3}", "{}", "{{1,2},{3,4}}", "[0:1]={1,2}"), ("array", "array"), _f(2, 3)),
    Case("text[]", ('{"a,b","NULL",NULL,"\\"q\\"","back\\\\slash",""," sp ","{x}"}', "{}"), ("array", "array")),
    Case("character varying(3)[]", ("{ab,NULL}",), ("array", "array")),
    Case("character(3)[]", ("{a,bc}",), ("array", "array")),
    Case("boolean[]", ("{t,f,NULL}",), ("array", "array")),
    Case("smallint[]", ("{-32768,32767}",), ("array", "array")),
    Case("bigint[]", ("{-9223372036854775808}",), ("array", "array")),
    Case("numeric(10,2)[]", ("{1.5,NULL,-0.01}", "{1.5,NaN}"), ("array", "array"), _f(1), _f(),
         declared=("numeric(10,2)[]", "numeric[]")),
    Case("numeric[]", ("{1.5,NaN,Infinity,-Infinity}",), ("array", "array")),
    Case("real[]", ("{1.1,NaN}",), ("array", "array")),
    Case("double precision[]", ("{NaN,Infinity,-Infinity,1.5,0.1}",), ("array", "array")),
    Case("bytea[]", ('{"\\\\x00ff",NULL,"\\\\x"}',), ("array", "array")),
    Case("date[]", ("{2024-01-01,NULL}", "{2024-01-01,infinity}"), ("array", "array"), _f(1)),
    Case("timestamp[]", ('{"2024-01-01 00:00:00.5"}',), ("array", "array")),
    Case("timestamp with time zone[]", ('{"2024-01-02 03:04:05+02"}', '{"-infinity"}'), ("array", "array"), _f(1)),
    Case("time[]", ('{"04:05:06"}',), ("array", "array")),
    Case("interval[]", ('{"1 day","-00:00:01","3 mons"}',), ("array", "array")),
    Case("uuid[]", ("{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",), ("array", "array")),
    Case("jsonb[]", ('{"{\\"a\\": 1}",null}',), ("array", "array")),
    Case("json[]", ('{"{\\"a\\":  1}"}',), ("array", "array")),
    Case("inet[]", ("{10.0.0.1/8,::1}",), ("array", "array")),
    Case("mood", ("happy", "sad"), ("exact", "exact")),
    Case("mood[]", ("{happy,NULL}",), ("array", "array"), oracle="v::text[]"),
    Case("posint", ("3",), ("int4", "exact")),
    Case("posint[]", ("{1,2}",), ("array", "array"), oracle="v::text[]"),
    Case("intarr", ("{1,NULL}",), ("array", "exact")),
    Case("money2", ("2.50",), ("numeric", "exact")),
    Case("int4range", ("[1,5)", "empty"), ("exact", "exact")),
    Case("money", ("1.50",), ("exact", "exact")),
    Case("bit(3)", ("101",), ("exact", "exact")),
    Case("bit varying", ("10101",), ("exact", "exact")),
    Case("tsvector", ("a fat cat",), ("exact", "exact")),
    Case("box[]", ("{(1,1),(0,0);(2,2),(1,1)}",), ("exact", "exact")),
    Case("int4range[]", ('{"[1,3)",empty}',), ("array", "array"), oracle="v::text[]"),
    Case("pair", ('(1,"x y")',), ("exact", "exact")),
]

_SETUP = [
    "CREATE TYPE mood AS ENUM ('happy', 'sad')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN intarr AS integer[]",
    "CREATE DOMAIN money2 AS numeric(10,2)",
    "CREATE TYPE pair AS (a int, b text)",
]


def _capture(db: Any, plugin: str) -> tuple[dict[str, list[RowChange]], dict[int, tuple[str, str]], Any]:
    """Create the tables, fill them, decode the slot: rows per table, pgoutput's types, a connection."""
    conn = connect(ConnectionTarget(db.dsn, "test"))  # pgpoll's pinned session settings
    slot = db.slot_name("typed")
    cur = conn.cursor()
    for statement in _SETUP:
        cur.execute(statement)
    if plugin == "pgoutput":
        cur.execute("CREATE PUBLICATION typedpub FOR ALL TABLES")
    create_slot(conn, slot, plugin)
    for n, case in enumerate(CASES):
        table = sql.Identifier(f"t{n}")
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v {})").format(table, sql.SQL(case.sql_type)))
        for i, literal in enumerate(case.literals):
            cur.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s::{})").format(table, sql.SQL(case.sql_type)),
                        (i, literal))
        cur.execute(sql.SQL("INSERT INTO {} VALUES (%s, NULL)").format(table), (len(case.literals),))
    options = peek_options(plugin, publications=["typedpub"])
    rows: dict[str, list[RowChange]] = {}
    if plugin == "pgoutput":
        po = PgoutputDecoder(1)
        for lsn, _xid, data in peek_rows(conn, slot, plugin, options=options):
            event = po.decode(data, lsn)
            if isinstance(event, RowChange):
                rows.setdefault(event.table, []).append(event)
        return rows, po.types, conn
    td = TestDecodingDecoder()
    for lsn, xid, data in peek_rows(conn, slot, plugin, options=options, raw_text=True):
        event = td.decode(data.decode(), lsn=lsn, xid=xid)
        if isinstance(event, RowChange):
            rows.setdefault(event.table, []).append(event)
    return rows, {}, conn


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_typed_values_equal_what_psycopg2_reads(db: Any, plugin: str) -> None:
    if plugin == "test_decoding":
        db.require_plugin("test_decoding")
    rows, types, conn = _capture(db, plugin)
    cur = conn.cursor()
    compared = 0
    for n, case in enumerate(CASES):
        events = rows[f"t{n}"]
        column = events[0].columns[1]
        if plugin == "pgoutput":
            assert column.type_oid is not None and column.type_modifier is not None
            t = type_from_oid(column.type_oid, column.type_modifier, types)
        else:
            assert column.type_name is not None
            t = type_from_name(column.type_name)
        which = 0 if plugin == "pgoutput" else 1
        where = f"{case.sql_type} via {plugin}: {t}"
        assert t.kind == case.kinds[which], where
        if case.declared[which]:
            assert t.declared == case.declared[which], where
        assert PgType.from_json(t.to_json()) == t
        by_id = {int(e.after["id"] or 0): e.after["v"] for e in events if e.after is not None}
        texts = [by_id[i] for i in range(len(by_id))]
        assert len(texts) == len(case.literals) + 1 and texts[-1] is None, where
        array, fallbacks = to_arrow(t, texts)
        expected_fallbacks = case.fallbacks if plugin == "pgoutput" or case.td_fallbacks is None else case.td_fallbacks
        assert set(fallbacks) == expected_fallbacks, (where, texts)
        lake = array.to_pylist()
        assert lake[-1] is None
        oracle = "format('%%s', v)" if t.kind == "exact" else case.oracle
        table = sql.Identifier(f"t{n}")
        for i, text in enumerate(texts[:-1]):
            assert text is not None
            if i in expected_fallbacks:
                assert lake[i] is None, (where, text)
                cur.execute(sql.SQL("SELECT format('%%s', v) FROM {} WHERE id = %s").format(table), (i,))
                printed = cur.fetchone()[0]
                assert text == printed, where
                with pytest.raises(Unrepresentable):
                    parse_value(t, text)
                continue
            cur.execute(sql.SQL("SELECT {} FROM {} WHERE id = %s").format(sql.SQL(oracle), table), (i,))
            source = comparable_source(cur.fetchone()[0], t)
            assert comparable_lake(lake[i], t) == source, (where, text, lake[i])
            assert comparable_lake(parse_value(t, text), t) == source, (where, text)
            compared += 1
    assert compared == sum(len(c.literals) for c in CASES) - sum(
        len(c.fallbacks if plugin == "pgoutput" or c.td_fallbacks is None else c.td_fallbacks) for c in CASES
    )
    conn.close()


def test_pgoutput_type_messages_name_the_base_type(db: Any) -> None:
    """logicalrep_write_typ sends getBaseType's name: a domain over int4 is ('pg_catalog', 'int4')."""
    _rows, types, conn = _capture(db, "pgoutput")
    cur = conn.cursor()
    cur.execute("SELECT 'posint'::regtype::oid, '_posint'::regtype::oid, 'intarr'::regtype::oid, 'mood'::regtype::oid")
    posint, posint_array, intarr, mood = cur.fetchone()
    assert types[posint] == ("pg_catalog", "int4")
    assert types[posint_array] == ("public", "_posint")
    assert types[intarr] == ("pg_catalog", "_int4")
    assert types[mood] == ("public", "mood")
    conn.close()


def test_static_oid_table_matches_the_server(db: Any) -> None:
    """Every built-in OID the static tables know names the same type on the server."""
    from pgpoll.typed import mapping

    rows = db.execute("SELECT oid::int, typname, typelem::int, typdelim FROM pg_type WHERE oid < 10000")
    by_oid = {oid: (name, elem, delim) for oid, name, elem, delim in rows}
    for oid, name in mapping._OIDS.items():
        assert by_oid[oid][0] == name, oid
    for oid, element in mapping._ARRAY_OIDS.items():
        name, elem, delim = by_oid[oid]
        assert (name, elem) == ("_" + mapping._OIDS[element], element), oid
        assert (delim == ",") or mapping._OIDS[element] in mapping._SEMICOLON_ELEMENTS, oid
    # format_type agrees with `declared` for typmod'd types
    for oid, typmod in ((1700, ((10 << 16) | 2) + 4), (1043, 24), (1042, 9), (1184, 3), (1083, 2), (1560, 3),
                        (1231, ((12 << 16) | 3) + 4), (1700, ((5 << 16) | (-2 & 0x7FF)) + 4)):
        assert type_from_oid(oid, typmod).declared == db.execute("SELECT format_type(%s, %s)", (oid, typmod))[0][0]


_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    months=st.integers(-(2**31) + 1, 2**31 - 1),  # INT_MIN months and days mark -infinity since PostgreSQL 17
    days=st.integers(-(2**31) + 1, 2**31 - 1),
    micros=st.integers(-(2**62), 2**62),  # make_interval goes through a double: stay clear of the int64 ends
    texts=st.lists(st.one_of(st.none(), st.text(_CHARS, max_size=8)), max_size=5),
)
def test_random_intervals_and_text_arrays(
    db: Any, months: int, days: int, micros: int, texts: list[str | None]
) -> None:
    """The output function's text (what both plugins send) parses back to what PostgreSQL stored."""
    conn = connect(ConnectionTarget(db.dsn, "test"))
    try:
        cur = conn.cursor()
        # make_interval takes no bigint of microseconds: build the time part from seconds
        cur.execute(
            "SELECT i::text, " + _INTERVAL_PARTS.replace("v", "i") + " FROM (SELECT make_interval(0, %s, 0, %s)"
            " + make_interval(secs => %s::numeric / 1000000) AS i) s",
            (months, days, micros),
        )
        text, parts = cur.fetchone()
        assert parse_value(type_from_name("interval"), text) == dict(zip(("months", "days", "microseconds"), parts, strict=True))
        cur.execute("SELECT %s::text[]::text", (texts,))
        literal = cur.fetchone()[0]
        assert parse_value(type_from_name("text[]"), literal) == texts
    finally:
        conn.close()


def test_interval_infinity_is_a_fallback(db: Any) -> None:
    """PostgreSQL 17 added infinite intervals; they print as text the struct cannot hold."""
    if db.major < 17:
        pytest.skip("infinite intervals need PostgreSQL 17")
    t = type_from_name("interval")
    for literal in ("infinity", "-infinity"):
        text = db.execute("SELECT %s::interval::text", (literal,))[0][0]
        assert text == literal
        assert to_arrow(t, [text])[1] == [0]
