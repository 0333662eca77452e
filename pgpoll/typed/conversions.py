"""Value text to typed values: one value (:func:`parse_value`) or a column (:func:`to_arrow`).

The input is a value's output-function text as both plugins give it, under
pgpoll's pinned session settings (``TimeZone=UTC``, ``DateStyle=ISO, MDY``,
``IntervalStyle=postgres``, ``extra_float_digits=1``, ``bytea_output=hex``),
with booleans as ``true``/``false``. A value the typed type cannot hold
(``NaN`` in a decimal, a BC date, a 2-D array...) raises
:class:`Unrepresentable` from :func:`parse_value`; :func:`to_arrow` puts a
null in its slot and reports its row index, so the caller can keep the exact
text. See :mod:`pgpoll.typed.mapping` for the table.

Python values per kind: ``bool``, ``int``, ``float``, ``Decimal`` (typed
numeric), ``str`` (every string kind), ``bytes``, ``date``, ``datetime``
(naive for timestamp, UTC-aware for timestamptz), ``dict`` with ``months``,
``days``, ``microseconds`` (interval), ``list`` (arrays, ``None`` for NULL
elements).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from pgpoll.typed.mapping import PgType, arrow_type, decimal_shape

__all__ = ["Unrepresentable", "parse_array", "parse_interval", "parse_value", "to_arrow"]


class Unrepresentable(ValueError):  # noqa: N818 -- a signal to keep the text, not a failure
    """The typed type cannot hold this value; keep its exact text instead."""


# ---- scalars -------------------------------------------------------------------------

_BOOLS = {"true": True, "false": False, "t": True, "f": False}


def _bool(text: str) -> bool:
    try:
        return _BOOLS[text]
    except KeyError:
        raise Unrepresentable(f"not a boolean: {text!r}") from None


def _int_parser(bits: int, signed: bool = True) -> Callable[[str], int]:
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2**bits)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise Unrepresentable(f"not an integer: {text!r}") from None
        if not low <= value < high:
            raise Unrepresentable(f"{text} is out of range for a {bits}-bit integer")
        return value

    return parse


def _float(text: str) -> float:
    try:
        return float(text)  # Python reads NaN, Infinity, -Infinity as PostgreSQL prints them
    except ValueError:
        raise Unrepresentable(f"not a float: {text!r}") from None


def _decimal_parser(t: PgType) -> Callable[[str], Any]:
    shape = decimal_shape(t)
    if shape is None:
        return _identity  # unconstrained or too wide: the exact text
    precision, scale = shape

    def parse(text: str) -> Decimal:
        try:
            value = Decimal(text)
        except InvalidOperation:
            raise Unrepresentable(f"not a numeric: {text!r}") from None
        if not value.is_finite():
            raise Unrepresentable(f"decimal({precision},{scale}) cannot hold {text}")
        _sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        if -exponent > scale or (len(digits) + exponent + scale > precision and value != 0):
            raise Unrepresentable(f"decimal({precision},{scale}) cannot hold {text}")
        return value

    return parse


def _identity(text: str) -> str:
    return text


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise Unrepresentable("bytea text is not in hex format (bytea_output=hex)")
    try:
        return bytes.fromhex(text[2:])
    except ValueError:
        raise Unrepresentable(f"not hex bytea: {text[:20]!r}") from None


_DATE_RE = re.compile(r"(\d{4})-(\d\d)-(\d\d)")
_TIMESTAMP_RE = re.compile(
    r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
)


def _date(text: str) -> date:
    m = _DATE_RE.fullmatch(text)  # infinity, -infinity, '... BC' and 5-digit years do not match
    if m is None:
        raise Unrepresentable(f"date outside 0001-01-01..9999-12-31: {text!r}")
    return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def _timestamp_match(text: str, with_zone: bool) -> re.Match[str]:
    m = _TIMESTAMP_RE.fullmatch(text)
    if m is None or (m.group(8) is not None) != with_zone or m.group(1) == "0000":
        raise Unrepresentable(f"timestamp outside 0001..9999 or not ISO: {text!r}")
    return m


def _naive(m: re.Match[str]) -> datetime:
    g = m.group
    micros = int((g(7) or "").ljust(6, "0"))
    return datetime(int(g(1)), int(g(2)), int(g(3)), int(g(4)), int(g(5)), int(g(6)), micros)


def _timestamp(text: str) -> datetime:
    return _naive(_timestamp_match(text, False))


def _timestamptz(text: str) -> datetime:
    m = _timestamp_match(text, True)
    offset = timedelta(hours=int(m.group(9)), minutes=int(m.group(10) or 0), seconds=int(m.group(11) or 0))
    if m.group(8) == "-":
        offset = -offset
    try:
        return (_naive(m) - offset).replace(tzinfo=UTC)
    except OverflowError:
        raise Unrepresentable(f"timestamptz outside 0001..9999 in UTC: {text!r}") from None


# ---- interval ------------------------------------------------------------------------

_INTERVAL_PART = re.compile(r"([+-]?\d+) (year|mon|day)s?")
_INTERVAL_TIME = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_INT32 = 2**31


def parse_interval(text: str) -> dict[str, int]:
    """IntervalStyle ``postgres`` text -> ``{'months', 'days', 'microseconds'}``.

    EncodeInterval (INTSTYLE_POSTGRES) prints nonzero ``N year(s)``, ``N
    mon(s)``, ``N day(s)`` then, when the time is nonzero or all is zero,
    ``[+-]HH:MM:SS[.ffffff]`` (hours may exceed 24 and have more digits).
    Each field carries its own sign. ``infinity`` and ``-infinity`` (PostgreSQL
    17+) raise :class:`Unrepresentable`.
    """
    months = days = micros = 0
    pos = 0
    n = len(text)
    seen_time = False
    while pos < n:
        if text[pos] == " ":
            pos += 1
            continue
        m = _INTERVAL_PART.match(text, pos)
        if m and not seen_time:
            value = int(m.group(1))
            unit = m.group(2)
            if unit == "year":
                months += 12 * value
            elif unit == "mon":
                months += value
            else:
                days += value
            pos = m.end()
            continue
        m = _INTERVAL_TIME.match(text, pos)
        if m is None or seen_time:
            raise Unrepresentable(f"not an IntervalStyle=postgres interval: {text!r}")
        seen_time = True
        total = (int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4))) * 1_000_000
        total += int((m.group(5) or "").ljust(6, "0"))
        micros = -total if m.group(1) == "-" else total
        pos = m.end()
    if n == 0 or not (-_INT32 <= months < _INT32 and -_INT32 <= days < _INT32):
        raise Unrepresentable(f"not an IntervalStyle=postgres interval: {text!r}")
    return {"months": months, "days": days, "microseconds": micros}


def _interval(text: str) -> dict[str, int]:
    return parse_interval(text)


# ---- arrays --------------------------------------------------------------------------


#: array_isspace: the only characters array_in skips and array_out quotes (not Unicode spaces).
_ARRAY_SPACE = " \t\n\r\v\f"


def parse_array(text: str, delimiter: str = ",") -> list[str | None]:
    """A one-dimensional array literal (``array_out`` text) -> element texts, ``None`` for NULL.

    Reads what ``array_in`` reads: ``"..."`` quoting with backslash escapes,
    backslash escapes in unquoted elements, whitespace around elements, an
    unquoted ``NULL`` (any case) as null; ``"NULL"`` is the string. Raises
    :class:`Unrepresentable` for explicit bounds (``[0:1]={1,2}``), more than
    one dimension, and malformed text.
    """
    n = len(text)
    pos = 0
    while pos < n and text[pos] in _ARRAY_SPACE:
        pos += 1
    if pos >= n or text[pos] != "{":
        raise Unrepresentable(f"not a one-dimensional array with default bounds: {text[:40]!r}")
    pos += 1
    out: list[str | None] = []
    expect_element = True
    while True:
        while pos < n and text[pos] in _ARRAY_SPACE:
            pos += 1
        if pos >= n:
            raise Unrepresentable(f"unterminated array literal: {text[:40]!r}")
        c = text[pos]
        if c == "}":
            if expect_element and out:
                raise Unrepresentable(f"array literal ends after a delimiter: {text[:40]!r}")
            pos += 1
            break
        if not expect_element:
            if c != delimiter:
                raise Unrepresentable(f"expected {delimiter!r} in array literal: {text[:40]!r}")
            pos += 1
            expect_element = True
            continue
        if c == "{":
            raise Unrepresentable("array has more than one dimension")
        if c == '"':
            pos += 1
            chars: list[str] = []
            while True:
                if pos >= n:
                    raise Unrepresentable(f"unterminated quoted array element: {text[:40]!r}")
                c = text[pos]
                if c == "\\" and pos + 1 < n:
                    chars.append(text[pos + 1])
                    pos += 2
                elif c == '"':
                    pos += 1
                    break
                else:
                    chars.append(c)
                    pos += 1
            out.append("".join(chars))
        else:
            chars = []
            escaped = False
            trailing = 0  # unescaped whitespace at the end, trimmed like array_in
            while pos < n and text[pos] not in (delimiter, "}"):
                c = text[pos]
                if c in '{"':
                    raise Unrepresentable(f"malformed array literal: {text[:40]!r}")
                if c == "\\" and pos + 1 < n:
                    chars.append(text[pos + 1])
                    escaped = True
                    trailing = 0
                    pos += 2
                    continue
                chars.append(c)
                trailing = trailing + 1 if c in _ARRAY_SPACE else 0
                pos += 1
            element = "".join(chars[: len(chars) - trailing])
            if not element and not escaped:
                raise Unrepresentable(f"empty unquoted array element: {text[:40]!r}")
            out.append(None if not escaped and element.upper() == "NULL" else element)
        expect_element = False
    if text[pos:].strip(_ARRAY_SPACE):
        raise Unrepresentable(f"text after the array literal: {text[:40]!r}")
    return out


def _array_parser(t: PgType) -> Callable[[str], list[Any]]:
    assert t.element is not None
    parse_element = _parser(t.element)

    def parse(text: str) -> list[Any]:
        return [None if e is None else parse_element(e) for e in parse_array(text)]

    return parse


# ---- dispatch ------------------------------------------------------------------------

_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _bool, "int2": _int_parser(16), "int4": _int_parser(32), "int8": _int_parser(64),
    "oid": _int_parser(32, signed=False), "float4": _float, "float8": _float,
    "text": _identity, "bytea": _bytea, "date": _date, "time": _identity, "timetz": _identity,
    "timestamp": _timestamp, "timestamptz": _timestamptz, "interval": _interval, "uuid": _identity,
    "json": _identity, "jsonb": _identity, "inet": _identity, "cidr": _identity, "macaddr": _identity,
    "macaddr8": _identity, "exact": _identity,
}


#: Kinds whose text Arrow's string cast reads exactly as PostgreSQL prints it
#: (``true``/``false``, integers, floats with ``NaN`` and ``[-]Infinity``).
_CAST_KINDS = frozenset({"bool", "int2", "int4", "int8", "oid", "float4", "float8"})


def _parser(t: PgType) -> Callable[[str], Any]:
    if t.kind == "numeric":
        return _decimal_parser(t)
    if t.kind == "array":
        return _array_parser(t)
    return _PARSERS[t.kind]


def parse_value(t: PgType, text: str) -> Any:
    """One value's text -> its typed Python value; raises :class:`Unrepresentable`."""
    return _parser(t)(text)


def to_arrow(t: PgType, texts: Sequence[str | None]) -> tuple[pa.Array[Any], list[int]]:
    """A column of value texts -> (the typed Arrow array, the fallback row indexes).

    ``None`` is null (not a fallback). A text the typed type cannot hold is
    null in the array and its index is in the list; the caller keeps the
    exact text elsewhere.
    """
    at = arrow_type(t)
    parse = _parser(t)
    if parse is _identity:
        return pa.array(texts, type=at), []
    if t.kind in _CAST_KINDS:
        try:  # Arrow's own parsers: 10x faster, and float4 text straight to float32 (no double rounding)
            return pa.array(texts, type=pa.string()).cast(at), []
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # some text is not what the server prints: value by value, with fallbacks
    values: list[Any] = []
    fallbacks: list[int] = []
    for i, text in enumerate(texts):
        if text is None:
            values.append(None)
            continue
        try:
            values.append(parse(text))
        except Unrepresentable:
            values.append(None)
            fallbacks.append(i)
    return pa.array(values, type=at), fallbacks
