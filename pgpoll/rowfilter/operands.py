"""Text values to comparable keys, one family of PostgreSQL types at a time.

Values are what the type's output function prints under pgpoll's session
settings (DateStyle ISO, TimeZone UTC, booleans ``true``/``false``);
constants are input text, checked as PostgreSQL's input function would for
the forms pgpoll accepts (ISO dates and timestamps only; no ``now``/``today``;
integers and decimals without ``_`` or ``0x``; booleans as ``boolin`` reads
them). Keys of one family compare with Python's operators the way PostgreSQL
compares the values: numeric and float ``NaN`` equal each other and sort
above everything; ``real`` values are rounded to single precision;
``character(n)`` ignores trailing spaces; dates and timestamps become
integers (days, microseconds since 1970-01-01 UTC), ``infinity`` included and
BC years counted astronomically.
"""

from __future__ import annotations

import re
import struct
from decimal import Decimal
from typing import Any

__all__ = ["INT_BITS", "family_of", "key", "num_key"]

INT_BITS = {"smallint": 16, "integer": 32, "bigint": 64}
_FAMILIES = {
    "smallint": "int", "integer": "int", "bigint": "int", "numeric": "numeric", "real": "float4",
    "double precision": "float8", "boolean": "bool", "text": "text", "character varying": "text",
    "name": "text", "character": "bpchar", "bpchar": "bpchar", "date": "date",
    "timestamp without time zone": "timestamp", "timestamp with time zone": "timestamptz",
}
_INF = 1 << 80


def family_of(type_name: str) -> str:
    """The comparison family of a test_decoding type name (``other`` when unsupported)."""
    base = re.sub(r"\(\d+(?:,\d+)?\)", "", type_name).strip()
    return "other" if type_name.endswith("]") else _FAMILIES.get(base, "other")


_INT_RE = re.compile(r"\s*[+-]?[0-9]+\s*\Z")
_DEC_RE = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*\Z")
_SPECIAL = {"nan": "NaN", "infinity": "Infinity", "+infinity": "Infinity", "-infinity": "-Infinity",
            "inf": "Infinity", "+inf": "Infinity", "-inf": "-Infinity"}
_DATE = r"([0-9]{4,})-([0-9]{2})-([0-9]{2})"
_TIME = r"[ T]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?"
_ZONE = r"(Z|[+-][0-9]{2}(?::?[0-9]{2}(?::[0-9]{2})?)?)"
_DT_RES = {
    "date": re.compile(rf"\s*{_DATE}( BC)?\s*\Z"),
    "timestamp": re.compile(rf"\s*{_DATE}(?:{_TIME})?( BC)?\s*\Z"),
    "timestamptz": re.compile(rf"\s*{_DATE}(?:{_TIME}{_ZONE}?)?( BC)?\s*\Z"),
}
_BOOL_WORDS = (("true", True, 1), ("false", False, 1), ("yes", True, 1), ("no", False, 1),
               ("on", True, 2), ("off", False, 2), ("1", True, 1), ("0", False, 1))


def num_key(value: Decimal | float) -> tuple[int, Any]:
    return (1, 0) if value != value else (0, value)


def _f32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _days(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _datetime_key(family: str, text: str) -> int:
    low = text.strip().lower()
    if low in ("infinity", "+infinity", "-infinity"):
        return -_INF if low[0] == "-" else _INF
    m = _DT_RES[family].match(text)
    if m is None:
        raise ValueError(f"not an ISO {family}")
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if m.group(m.lastindex or 0) == " BC" or text.rstrip().endswith(" BC"):
        year = 1 - year
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    month_days = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    if not (1 <= month <= 12 and 1 <= day <= (29 if month == 2 and leap else month_days[month - 1])):
        raise ValueError("date out of range")
    days = _days(year, month, day)
    if family == "date":
        return days
    hh, mi = int(m.group(4) or 0), int(m.group(5) or 0)
    ss, frac = int(m.group(6) or 0), (m.group(7) or "").ljust(6, "0")
    if hh > 24 or mi > 59 or ss > 60 or (hh == 24 and (mi or ss or int(frac))):
        raise ValueError("time out of range")
    micros = ((days * 24 + hh) * 60 + mi) * 60_000_000 + ss * 1_000_000 + int(frac)
    zone = m.group(8) if family == "timestamptz" else None
    if zone and zone != "Z":
        parts = zone[1:].replace(":", "")
        offset = int(parts[0:2]) * 3600 + int(parts[2:4] or 0) * 60 + int(parts[4:6] or 0)
        micros -= (offset if zone[0] == "+" else -offset) * 1_000_000
    return micros


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    for word, value, minimum in _BOOL_WORDS:
        if len(low) >= minimum and word.startswith(low):
            return value
    raise ValueError("not a boolean")


def key(family: str, type_name: str, text: str, literal: bool) -> Any:
    """The comparable value of ``text`` as a value of ``family`` (``literal``: a constant's input text)."""
    if family == "int":
        if literal and not _INT_RE.match(text):
            raise ValueError("not an integer")
        value = int(text)
        bits = INT_BITS.get(type_name, 64)
        if literal and not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise ValueError(f"out of range for type {type_name}")
        return value
    if family in ("numeric", "float4", "float8"):
        special = _SPECIAL.get(text.strip().lower())
        if literal and special is None and not _DEC_RE.match(text):
            raise ValueError("not a number")
        if family == "numeric":
            return num_key(Decimal(special or text.strip()))
        number = float(special or text)
        return num_key(_f32(number) if family == "float4" else number)
    if family == "bool":
        return _parse_bool(text) if literal else text in ("true", "t")
    if family == "bpchar":
        return text.rstrip(" ")
    if family in _DT_RES:
        return _datetime_key(family, text)
    return text


