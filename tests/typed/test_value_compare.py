"""pgpoll.testing.value_compare: source and lake values made comparable."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import Row

from pgpoll.testing.value_compare import FloatValue, IntervalValue, comparable_lake, comparable_source
from pgpoll.typed.conversions import to_arrow
from pgpoll.typed.mapping import type_from_name

T = type_from_name
UTC = UTC


def test_float_nan_and_float32() -> None:
    assert FloatValue(math.nan) == FloatValue(math.nan)
    assert FloatValue(1.0) != FloatValue(math.nan)
    assert comparable_source(math.nan, T("double precision")) == comparable_lake(math.nan, T("double precision"))
    assert comparable_source(math.inf, T("real")) == comparable_lake("Infinity", T("real"))
    lake = to_arrow(T("real"), ["1.1"])[0].to_pylist()[0]
    assert lake != 1.1
    assert comparable_source(1.1, T("real")) == comparable_lake(lake, T("real"))
    assert comparable_source(1.1, T("double precision")) != comparable_lake(lake, T("double precision"))
    assert len({FloatValue(math.nan), FloatValue(float("nan"))}) == 1


def test_numeric_scale_and_specials() -> None:
    t = T("numeric(10,2)")
    assert comparable_source(Decimal("1.50"), t) == comparable_lake(Decimal("1.5"), t)
    assert comparable_source(Decimal("1.50"), t) != comparable_lake(Decimal("1.51"), t)
    u = T("numeric")
    assert comparable_source(Decimal("NaN"), u) == comparable_lake("NaN", u)
    assert comparable_source(Decimal("-Infinity"), u) == comparable_lake("-Infinity", u)
    assert comparable_source(Decimal("Infinity"), u) != comparable_lake("-Infinity", u)
    assert comparable_source(Decimal("1E+2"), u) == comparable_lake("100", u)


def test_timestamptz() -> None:
    t = T("timestamp with time zone")
    plus2 = timezone(timedelta(hours=2))
    source = comparable_source(datetime(2024, 1, 2, 5, 4, 5, tzinfo=plus2), t)
    assert source == comparable_lake(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), t)
    assert source == comparable_lake("2024-01-02 03:04:05+00", t)
    # PySpark gives a naive datetime in this process's local time zone
    local = datetime.fromtimestamp(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp())
    assert local.tzinfo is None
    assert source == comparable_lake(local, t)
    assert comparable_lake("infinity", t) == "infinity"  # a fallback's text stays text


def test_timestamp_date_bytes() -> None:
    assert comparable_source(datetime(2024, 1, 2), T("timestamp without time zone")) == comparable_lake(
        "2024-01-02 00:00:00", T("timestamp without time zone")
    )
    assert comparable_source(date(2024, 1, 2), T("date")) == comparable_lake(date(2024, 1, 2), T("date"))
    assert comparable_lake("-infinity", T("date")) == "-infinity"
    assert comparable_source(memoryview(b"\x00\x01"), T("bytea")) == comparable_lake(bytearray(b"\x00\x01"), T("bytea"))
    assert comparable_source(memoryview(b"\x00\x01"), T("bytea")) == comparable_lake("\\x0001", T("bytea"))


def test_interval_exact_and_approximate() -> None:
    t = T("interval")
    parts = comparable_source([14, 3, 14_706_789_000], t)
    assert isinstance(parts, IntervalValue)
    assert parts == comparable_lake({"months": 14, "days": 3, "microseconds": 14_706_789_000}, t)
    assert parts == comparable_lake(Row(months=14, days=3, microseconds=14_706_789_000), t)
    assert parts == comparable_lake("1 year 2 mons 3 days 04:05:06.789", t)
    assert parts != comparable_lake({"months": 13, "days": 33, "microseconds": 14_706_789_000}, t)
    # psycopg2 reads a year as 365 days and a month as 30
    approx = comparable_source(timedelta(days=365 + 60 + 3, seconds=14706, microseconds=789000), t)
    assert approx == parts
    assert comparable_source(timedelta(days=-1), t) == comparable_lake("-1 days", t)
    assert comparable_source(timedelta(days=-1), t) == comparable_lake("-24:00:00", t)  # approximately
    assert comparable_lake("-1 days", t) != comparable_lake("-24:00:00", t)  # exactly
    neg = comparable_source(timedelta(days=-(365 + 60)), t)
    assert neg == comparable_lake("-1 years -2 mons", t)


def test_time_and_timetz() -> None:
    assert comparable_source(time(4, 5, 6, 789000), T("time without time zone")) == comparable_lake(
        "04:05:06.789", T("time without time zone")
    )
    tz = T("time with time zone")
    source = comparable_source(time(4, 5, 6, tzinfo=timezone(timedelta(hours=5, minutes=30))), tz)
    assert source == comparable_lake("04:05:06+05:30", tz)
    assert source != comparable_lake("22:35:06+00", tz)  # the same instant, not the same value
    assert comparable_lake("24:00:00", T("time without time zone")) == "24:00:00"


def test_json_strings_and_arrays() -> None:
    assert comparable_source({"a": [1, 2.5]}, T("jsonb")) == comparable_lake('{"a": [1, 2.5]}', T("jsonb"))
    assert comparable_source("x", T("json")) == comparable_lake('"x"', T("json"))
    assert comparable_source("a", T("text")) == comparable_lake("a", T("text"))
    assert comparable_source(None, T("text")) is None and comparable_lake(None, T("text")) is None
    arr = T("double precision[]")
    assert comparable_source([math.nan, None, 1.5], arr) == comparable_lake([math.nan, None, 1.5], arr)
    assert comparable_source([1, None], T("integer[]")) == comparable_lake("{1,NULL}", T("integer[]"))
    lake = to_arrow(T("interval[]"), ['{"1 day"}'])[0]
    assert isinstance(lake, pa.Array)
    interval_array = T("interval[]")
    lake_value = lake.to_pylist()[0]
    assert comparable_source([timedelta(days=1)], interval_array) == comparable_lake(lake_value, interval_array)
    assert comparable_source(True, T("boolean")) == comparable_lake("true", T("boolean"))
