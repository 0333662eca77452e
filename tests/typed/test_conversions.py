"""pgpoll.typed.conversions: value text to typed values and Arrow arrays, without a database."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from pgpoll.typed.conversions import Unrepresentable, parse_array, parse_interval, parse_value, to_arrow
from pgpoll.typed.mapping import INTERVAL_STRUCT, PgType, type_from_name

T = type_from_name
UTC = UTC

VALUES: list[tuple[str, str, Any]] = [
    ("boolean", "true", True),
    ("boolean", "false", False),
    ("boolean", "t", True),
    ("smallint", "-32768", -32768),
    ("integer", "2147483647", 2147483647),
    ("bigint", "-9223372036854775808", -(2**63)),
    ("oid", "4294967295", 4294967295),
    ("real", "1.1", 1.1),
    ("double precision", "-1.5e-300", -1.5e-300),
    ("double precision", "Infinity", math.inf),
    ("double precision", "-Infinity", -math.inf),
    ("numeric(10,2)", "12345678.91", Decimal("12345678.91")),
    ("numeric(10,2)", "-0.01", Decimal("-0.01")),
    ("numeric(5,-2)", "12300", Decimal("12300")),
    ("numeric(3,5)", "0.00123", Decimal("0.00123")),
    ("numeric(38,0)", "9" * 38, Decimal("9" * 38)),
    ("numeric", "NaN", "NaN"),
    ("numeric", "-Infinity", "-Infinity"),
    ("numeric", "1.50", "1.50"),
    ("numeric(40,2)", "1.50", "1.50"),
    ("text", "", ""),
    ("text", "ünï\n", "ünï\n"),
    ("character(5)", "ab   ", "ab   "),
    ("bytea", "\\x00ff00", b"\x00\xff\x00"),
    ("bytea", "\\x", b""),
    ("date", "2024-02-29", date(2024, 2, 29)),
    ("date", "0001-01-01", date(1, 1, 1)),
    ("date", "9999-12-31", date(9999, 12, 31)),
    ("time without time zone", "24:00:00", "24:00:00"),
    ("time with time zone", "04:05:06.789+05:30", "04:05:06.789+05:30"),
    ("timestamp without time zone", "2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
    ("timestamp without time zone", "2024-01-02 03:04:05.5", datetime(2024, 1, 2, 3, 4, 5, 500000)),
    ("timestamp without time zone", "0001-01-01 00:00:00", datetime(1, 1, 1)),
    ("timestamp with time zone", "2024-01-02 03:04:05.123456+00", datetime(2024, 1, 2, 3, 4, 5, 123456, UTC)),
    ("timestamp with time zone", "2024-01-02 03:04:05+05:30", datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)),
    ("timestamp with time zone", "2024-01-02 03:04:05-08", datetime(2024, 1, 2, 11, 4, 5, tzinfo=UTC)),
    ("timestamp with time zone", "1900-01-01 00:00:00+00:09:21", datetime(1899, 12, 31, 23, 50, 39, tzinfo=UTC)),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("jsonb", '{"a": 1}', '{"a": 1}'),
    ("inet", "10.0.0.1/8", "10.0.0.1/8"),
    ("mood", "happy", "happy"),
    ("int4range", "[1,5)", "[1,5)"),
    ("integer[]", "{1,NULL,-3}", [1, None, -3]),
    ("integer[]", "{}", []),
    ("boolean[]", "{t,f,NULL}", [True, False, None]),
    ("text[]", '{"a,b","NULL",NULL,"\\"q\\"","back\\\\slash",""," sp "}',
     ["a,b", "NULL", None, '"q"', "back\\slash", "", " sp "]),
    ("numeric(10,2)[]", "{1.50,NULL}", [Decimal("1.50"), None]),
    ("numeric[]", "{1.50,NaN,Infinity}", ["1.50", "NaN", "Infinity"]),
    ("double precision[]", "{Infinity,1.5}", [math.inf, 1.5]),
    ("bytea[]", '{"\\\\x00ff",NULL}', [b"\x00\xff", None]),
    ("date[]", "{2024-01-01}", [date(2024, 1, 1)]),
    ("timestamp with time zone[]", '{"2024-01-02 03:04:05+00"}', [datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)]),
    ("interval[]", '{"1 day",-00:00:01}', [{"months": 0, "days": 1, "microseconds": 0},
                                           {"months": 0, "days": 0, "microseconds": -1_000_000}]),
    ("mood[]", '{happy,NULL,"NULL"}', ["happy", None, "NULL"]),
    ("jsonb[]", '{"{\\"a\\": 1}"}', ['{"a": 1}']),
]


@pytest.mark.parametrize("name,text,expected", VALUES)
def test_parse_value(name: str, text: str, expected: Any) -> None:
    assert parse_value(T(name), text) == expected


def test_nan_parses_to_floats() -> None:
    assert math.isnan(parse_value(T("real"), "NaN"))
    assert math.isnan(parse_value(T("double precision"), "NaN"))
    assert parse_value(T("real"), "-Infinity") == -math.inf


FALLBACKS: list[tuple[str, str]] = [
    ("numeric(10,2)", "NaN"),
    ("numeric(10,2)", "Infinity"),
    ("numeric(10,2)", "-Infinity"),
    ("numeric(10,2)", "123456789.00"),  # more integer digits than the type (cannot come from the server)
    ("numeric(10,2)", "1.234"),
    ("numeric(10,2)", "abc"),
    ("date", "infinity"),
    ("date", "-infinity"),
    ("date", "0044-03-15 BC"),
    ("date", "10000-01-01"),
    ("timestamp without time zone", "infinity"),
    ("timestamp without time zone", "-infinity"),
    ("timestamp without time zone", "2000-01-01 00:00:00 BC"),
    ("timestamp without time zone", "10000-01-01 00:00:00"),
    ("timestamp without time zone", "2024-01-02 03:04:05+00"),  # a zone where none belongs
    ("timestamp with time zone", "infinity"),
    ("timestamp with time zone", "-infinity"),
    ("timestamp with time zone", "1000-01-01 00:00:00+00 BC"),
    ("timestamp with time zone", "2024-01-02 03:04:05"),
    ("timestamp with time zone", "0001-01-01 00:00:00+01"),  # before 0001-01-01 in UTC
    ("interval", "infinity"),
    ("interval", "-infinity"),
    ("interval", "P1Y"),
    ("interval", "@ 1 day"),
    ("interval", ""),
    ("interval", "2147483648 days"),
    ("bytea", "\\000"),
    ("bytea", "\\xzz"),
    ("boolean", "yes"),
    ("integer", "1.5"),
    ("double precision", "x"),
    ("integer[]", "{{1,2},{3,4}}"),
    ("integer[]", "[0:1]={1,2}"),
    ("integer[]", "{1,x}"),
    ("integer[]", "1,2"),
    ("numeric(10,2)[]", "{1.5,NaN}"),
    ("date[]", "{2024-01-01,infinity}"),
    ("mood[]", "{{a},{b}}"),
    ("mood[]", "[2:2]={a}"),
]


@pytest.mark.parametrize("name,text", FALLBACKS)
def test_unrepresentable(name: str, text: str) -> None:
    with pytest.raises(Unrepresentable):
        parse_value(T(name), text)
    array, fallbacks = to_arrow(T(name), [None, text, None])
    assert fallbacks == [1]
    assert array.to_pylist() == [None, None, None]


def test_unrepresentable_is_a_value_error() -> None:
    assert issubclass(Unrepresentable, ValueError)


# ---- interval -----------------------------------------------------------------------------

INTERVALS: list[tuple[str, tuple[int, int, int]]] = [
    ("00:00:00", (0, 0, 0)),
    ("1 year 2 mons 3 days 04:05:06.789", (14, 3, 14_706_789_000)),
    ("-1 years -2 mons +3 days -04:05:06.789", (-14, 3, -14_706_789_000)),
    ("-00:00:01", (0, 0, -1_000_000)),
    ("00:00:00.000001", (0, 0, 1)),
    ("1 day", (0, 1, 0)),
    ("-1 days", (0, -1, 0)),
    ("1 mon", (1, 0, 0)),
    ("1 mon -00:00:01", (1, 0, -1_000_000)),
    ("-7 days +02:00:00", (0, -7, 7_200_000_000)),
    ("1 year 1 mon -40 days +100:00:00", (13, -40, 360_000_000_000)),
    ("2147483647 days", (0, 2147483647, 0)),
    ("-178000000 years", (-2_136_000_000, 0, 0)),
    ("2562047788:00:54.775807", (0, 0, 9_223_372_036_854_775_807)),
    ("-2562047788:00:54.775808", (0, 0, -9_223_372_036_854_775_808)),
]


@pytest.mark.parametrize("text,parts", INTERVALS)
def test_parse_interval(text: str, parts: tuple[int, int, int]) -> None:
    assert parse_interval(text) == dict(zip(("months", "days", "microseconds"), parts, strict=True))
    array, fallbacks = to_arrow(T("interval"), [text])
    assert fallbacks == [] and array.type == INTERVAL_STRUCT
    assert array.to_pylist() == [parse_interval(text)]


# ---- array literals ---------------------------------------------------------------------------

ARRAYS: list[tuple[str, list[str | None]]] = [
    ("{}", []),
    ("{a}", ["a"]),
    ("{NULL}", [None]),
    ("{null,Null}", [None, None]),
    ('{"NULL"}', ["NULL"]),
    ("{\\NULL}", ["NULL"]),
    ('{""}', [""]),
    ('{"a,b",c}', ["a,b", "c"]),
    ('{"a\\"b"}', ['a"b']),
    ('{"a\\\\b"}', ["a\\b"]),
    ('{"{x}"}', ["{x}"]),
    ("{ a , b }", ["a", "b"]),
    ('{ "a" , "b" }', ["a", "b"]),
    ("  {a}  ", ["a"]),
    ("{a b}", ["a b"]),
    ("{a\\ }", ["a "]),
    ('{"ü ☃"}', ["ü ☃"]),
    ("{\xa0,a\u2003b}", ["\xa0", "a\u2003b"]),  # array_out quotes only ASCII white space
    ("{\ta\n}", ["a"]),
]


@pytest.mark.parametrize("text,elements", ARRAYS)
def test_parse_array(text: str, elements: list[str | None]) -> None:
    assert parse_array(text) == elements


@pytest.mark.parametrize(
    "text", ["", "a", "{", "{a", '{"a}', "{a,}", "{,a}", "{a}x", "{{a}}", "[1:1]={a}", '{a"b}', "{a{b}", '{"a" "b"}']
)
def test_parse_array_refuses(text: str) -> None:
    with pytest.raises(Unrepresentable):
        parse_array(text)


def test_parse_array_other_delimiter() -> None:
    assert parse_array("{(1,1),(0,0);(2,2),(1,1)}", ";") == ["(1,1),(0,0)", "(2,2),(1,1)"]


# ---- to_arrow --------------------------------------------------------------------------------


def test_to_arrow_types_and_nulls() -> None:
    for name, texts, expected in [
        ("integer", ["1", None, "-2"], [1, None, -2]),
        ("real", ["1.5", "NaN"], None),
        ("numeric(10,2)", ["1.50", None, "NaN"], [Decimal("1.50"), None, None]),
        ("numeric", ["NaN", "1.50"], ["NaN", "1.50"]),
        ("text", ["a", None], ["a", None]),
        ("timestamp with time zone", ["2024-01-02 03:04:05+00"], [datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)]),
        ("integer[]", ["{1,NULL}", None, "{}"], [[1, None], None, []]),
        ("mood[]", ["{a,b}"], [["a", "b"]]),
    ]:
        t = T(name)
        array, fallbacks = to_arrow(t, texts)
        assert isinstance(array, pa.Array)
        assert len(array) == len(texts)
        if expected is not None:
            assert array.to_pylist() == expected, name
        assert fallbacks == ([2] if name == "numeric(10,2)" else []), name


def test_to_arrow_float4_rounds_to_float32() -> None:
    array, _ = to_arrow(T("real"), ["1.1", "NaN", "Infinity"])
    assert array.type == pa.float32()
    values = array.to_pylist()
    assert values[0] == pytest.approx(1.1) and values[0] != 1.1
    assert math.isnan(values[1]) and values[2] == math.inf


def test_to_arrow_empty_and_all_null() -> None:
    for name in ("integer", "interval", "numeric(10,2)[]", "text", "exact_type"):
        t = T(name)
        assert to_arrow(t, [])[0].to_pylist() == []
        assert to_arrow(t, [None, None]) [0].null_count == 2


def test_to_arrow_exact_keeps_text() -> None:
    t = PgType("exact", "public.mood")
    array, fallbacks = to_arrow(t, ["happy", None])
    assert array.type == pa.string() and array.to_pylist() == ["happy", None] and fallbacks == []
