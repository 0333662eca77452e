"""Make a source value and a lake value of the same column comparable, for tests.

:func:`comparable_source` takes what psycopg2 returns for a column (its own
adaptation: ``Decimal``, aware ``datetime``, ``memoryview``, ``timedelta``...)
and :func:`comparable_lake` what is read back from Parquet (a Spark ``Row``
field or a pyarrow ``to_pylist`` value; for a fallback row, the exact text
the caller kept). Both return plain Python objects that are equal exactly
when the two are the same value of the :class:`~pgpoll.typed.mapping.PgType`:

* floats become :class:`FloatValue` (NaN equals NaN; ``real`` rounded to float32);
* numerics become ``Decimal`` (equal regardless of scale) or the string
  ``'NaN'``, ``'Infinity'``, ``'-Infinity'``;
* timestamptz becomes an aware UTC ``datetime`` (a naive one from Spark is
  read as this process's local time, as PySpark makes it);
* bytes-like becomes ``bytes``; json/jsonb lake text becomes the parsed object
  (psycopg2 parses json itself, so a source value is taken as parsed);
* time text becomes ``datetime.time``, timetz a (naive time, UTC offset)
  pair (``24:00:00`` stays text);
* intervals become :class:`IntervalValue` -- exact (months, days,
  microseconds) from a struct, a ``Row``, a dict or a 3-tuple; approximate
  from a psycopg2 ``timedelta`` (which counts a year as 365 days and a month
  as 30), compared the same approximate way;
* arrays element by element; text values of typed kinds (a fallback's exact
  text) are parsed as PostgreSQL prints them.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from pgpoll.typed.conversions import Unrepresentable, parse_array, parse_interval, parse_value
from pgpoll.typed.mapping import PgType

__all__ = ["FloatValue", "IntervalValue", "comparable_lake", "comparable_source"]


@dataclass(frozen=True)
class FloatValue:
    """A float that equals itself when NaN."""

    value: float

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FloatValue):
            return NotImplemented
        if math.isnan(self.value) and math.isnan(other.value):
            return True
        return self.value == other.value

    def __hash__(self) -> int:
        return hash("nan") if math.isnan(self.value) else hash(self.value)


@dataclass(frozen=True)
class IntervalValue:
    """An interval as PostgreSQL stores it; ``approximate`` when only psycopg2's timedelta was known."""

    months: int
    days: int
    microseconds: int
    approximate: bool = False

    @staticmethod
    def from_timedelta(value: timedelta) -> IntervalValue:
        return IntervalValue(0, value.days, value.seconds * 1_000_000 + value.microseconds, True)

    def as_timedelta(self) -> timedelta:
        """psycopg2's reading of the interval: a year is 365 days, a month 30 (truncating like PostgreSQL)."""
        years = int(self.months / 12)
        months = self.months - 12 * years
        return timedelta(days=years * 365 + months * 30 + self.days, microseconds=self.microseconds)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalValue):
            return NotImplemented
        if self.approximate or other.approximate:
            return self.as_timedelta() == other.as_timedelta()
        return (self.months, self.days, self.microseconds) == (other.months, other.days, other.microseconds)

    def __hash__(self) -> int:
        return hash(self.as_timedelta())


_FLOAT32 = struct.Struct("<f")
_TIME_RE = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?")


def _float(value: Any, t: PgType) -> FloatValue:
    f = float(value)  # str 'NaN'/'Infinity' too
    if t.kind == "float4" and math.isfinite(f):
        f = _FLOAT32.unpack(_FLOAT32.pack(f))[0]
    return FloatValue(f)


def _numeric(value: Any) -> Any:
    d = value if isinstance(value, Decimal) else Decimal(str(value))
    if d.is_nan():
        return "NaN"
    if d.is_infinite():
        return "Infinity" if d > 0 else "-Infinity"
    return d


def _time(value: Any) -> Any:
    if isinstance(value, time):
        return (value.replace(tzinfo=None), value.utcoffset()) if value.tzinfo else value
    m = _TIME_RE.fullmatch(value)
    if m is None or m.group(1) == "24":
        return value
    g = m.group
    naive = time(int(g(1)), int(g(2)), int(g(3)), int((g(4) or "").ljust(6, "0")))
    if not g(5):
        return naive
    offset = timedelta(hours=int(g(6)), minutes=int(g(7) or 0), seconds=int(g(8) or 0))
    return (naive, -offset if g(5) == "-" else offset)


def _parsed_or_text(t: PgType, text: str) -> Any:
    """The typed value of a text, or the text itself when the typed type cannot hold it."""
    try:
        return parse_value(t, text)
    except Unrepresentable:
        return text


def _timestamptz(value: Any) -> Any:
    if isinstance(value, str):
        return _parsed_or_text(PgType("timestamptz", "timestamp with time zone"), value)
    if isinstance(value, datetime):
        return value.astimezone(UTC)  # a naive datetime is local time (PySpark's reading)
    return value


def _interval(value: Any) -> IntervalValue:
    if isinstance(value, IntervalValue):
        return value
    if isinstance(value, timedelta):
        return IntervalValue.from_timedelta(value)
    if isinstance(value, str):
        value = parse_interval(value)
    if isinstance(value, dict):
        return IntervalValue(int(value["months"]), int(value["days"]), int(value["microseconds"]))
    if hasattr(value, "asDict"):  # a Spark Row
        return _interval(value.asDict())
    months, days, micros = value
    return IntervalValue(int(months), int(days), int(micros))


def _scalar(value: Any, t: PgType, lake: bool) -> Any:
    kind = t.kind
    if kind in ("float4", "float8"):
        return _float(value, t)
    if kind == "numeric":
        return _numeric(value)
    if kind in ("int2", "int4", "int8", "oid"):
        return int(value)
    if kind == "bool":
        return value if isinstance(value, bool) else {"true": True, "false": False, "t": True, "f": False}[value]
    if kind == "bytea":
        if isinstance(value, str):
            return bytes.fromhex(value[2:])
        return bytes(value)
    if kind in ("date", "timestamp") and isinstance(value, str):
        return _parsed_or_text(t, value)
    if kind == "timestamptz":
        return _timestamptz(value)
    if kind in ("time", "timetz"):
        return _time(value)
    if kind == "interval":
        return _interval(value)
    if kind in ("json", "jsonb"):
        return json.loads(value) if lake else value  # psycopg2 parses json itself
    if kind == "uuid":
        return str(value)
    return value


def _comparable(value: Any, t: PgType, lake: bool) -> Any:
    if value is None:
        return None
    if t.kind == "array":
        assert t.element is not None
        if isinstance(value, str):
            value = parse_array(value)
        return [_comparable(v, t.element, lake) for v in value]
    return _scalar(value, t, lake)


def comparable_source(value: Any, t: PgType) -> Any:
    """A psycopg2 value of a column of ``t`` (default adaptation: json parsed), as a comparable Python object."""
    return _comparable(value, t, False)


def comparable_lake(value: Any, t: PgType) -> Any | None:
    """A value read back from Parquet (Spark or pyarrow), as a comparable Python object."""
    return _comparable(value, t, True)
