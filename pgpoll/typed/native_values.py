"""Values a snapshot reads in binary (``COPY ... (FORMAT binary)``) -> the typed tables' columns, exactly as from text.

Why binary: the server's send functions are cheaper than its output
functions (a ``timestamptz`` is 8 bytes, not a formatted date), and the
client then needs no text parsing; adbc-driver-postgresql reads the binary
COPY stream into Arrow in C++ (``pgpoll.source.snapshot.fetch``). This
module is the pure part: which kinds are read that way, and how their Arrow
values become exactly what :func:`pgpoll.sink.typed_columns.column_to_arrow`
gives for the same values' text -- the typed value, or, where the typed type
cannot hold it, null and the value's exact output-function text (for
``_untyped``).

Read natively (:data:`NATIVE_KINDS`): booleans, integers, ``oid``, floats,
text types (``text``, ``varchar``, ``char(n)`` with its padding, ``name``;
not ``"char"``, whose output escapes bytes its send function sends raw),
``bytea``, ``date``, ``timestamp``, ``timestamptz``. Every other column is
read as the server's text (``numeric``, ``uuid``, ``json``, ``interval``,
arrays, ...) and converted as a change's text is.

The driver converts PostgreSQL's day and microsecond counts (from
2000-01-01) to Arrow's (from 1970-01-01) by adding a constant with
two's-complement wrap-around; subtracting it again gives PostgreSQL's
values back exactly, ``infinity`` (the largest integer) included. Dates and
timestamps outside the years 1-9999 (what Spark holds, and the text path's
rule) keep their text, formatted here as PostgreSQL's ISO ``DateStyle``
under ``TimeZone=UTC`` prints them (``j2date`` of ``datetime.c``); a test
compares it with the server's own text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pgpoll.typed.mapping import PgType, arrow_type

__all__ = ["NATIVE_KINDS", "format_date", "format_timestamp", "native_to_typed", "read_natively"]

#: Kinds read in binary and converted here; every other kind is read as the server's text.
NATIVE_KINDS = frozenset({
    "bool", "int2", "int4", "int8", "oid", "float4", "float8", "text", "bytea", "date", "timestamp", "timestamptz",
})

_DAYS_1970 = 10957  # days from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch)
_US_1970 = _DAYS_1970 * 86_400_000_000
_DATE_MIN, _DATE_MAX = -719_162, 2_932_896  # 0001-01-01 and 9999-12-31, in days from 1970-01-01
_TS_MIN, _TS_MAX = _DATE_MIN * 86_400_000_000, (_DATE_MAX + 1) * 86_400_000_000 - 1
_POSTGRES_EPOCH_JDATE = 2_451_545
_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1


def read_natively(t: PgType) -> bool:
    """Whether a column of ``t`` is read in binary and converted by :func:`native_to_typed`."""
    return t.kind in NATIVE_KINDS and t.declared != '"char"'


def native_to_typed(t: PgType, values: pa.Array[Any]) -> tuple[pa.Array[Any], dict[int, str]]:
    """A column as read in binary -> (its typed array, the exact text of each value the typed type cannot hold)."""
    at = arrow_type(t)
    if t.kind == "oid":  # the driver reads an oid as a signed int32: reinterpret the 32 bits
        raw = _integers(values, np.int32)
        return _masked(pa.int64(), raw.view(np.uint32).astype(np.int64), values), {}
    if t.kind == "date":
        return _dates(values)
    if t.kind in ("timestamp", "timestamptz"):
        return _timestamps(values, at, t.kind == "timestamptz")
    if values.type != at:
        values = values.cast(at)
    return values, {}


def _integers(values: pa.Array[Any], dtype: Any) -> Any:
    """The integer storage of ``values`` (nulls as zero), as NumPy."""
    width = pa.int32() if np.dtype(dtype).itemsize == 4 else pa.int64()
    storage = values.view(width).fill_null(0)
    return np.asarray(storage.to_numpy(zero_copy_only=False), dtype=dtype)


def _masked(at: pa.DataType, data: Any, like: pa.Array[Any], drop: Any = None) -> pa.Array[Any]:
    """``data`` as an Arrow array of ``at``, null where ``like`` is null or ``drop`` is true."""
    mask = np.asarray(like.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    if drop is not None:
        mask = mask | drop
    return pa.array(data, type=at, mask=mask if mask.any() else None)


def _dates(values: pa.Array[Any]) -> tuple[pa.Array[Any], dict[int, str]]:
    days = _integers(values, np.int32)
    outside = (days < _DATE_MIN) | (days > _DATE_MAX)
    nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    texts: dict[int, str] = {}
    for row in np.flatnonzero(outside & ~nulls).tolist():
        pg_days = _wrap(int(days[row]) - _DAYS_1970, 32)
        texts[row] = format_date(pg_days)
    if not texts:
        return values if values.type == pa.date32() else values.cast(pa.date32()), {}
    return _masked(pa.date32(), days, values, outside), texts


def _timestamps(values: pa.Array[Any], at: pa.DataType, zone: bool) -> tuple[pa.Array[Any], dict[int, str]]:
    us = _integers(values, np.int64)
    outside = (us < _TS_MIN) | (us > _TS_MAX)
    nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    texts: dict[int, str] = {}
    for row in np.flatnonzero(outside & ~nulls).tolist():
        pg_us = _wrap(int(us[row]) - _US_1970, 64)
        texts[row] = format_timestamp(pg_us, zone=zone)
    if not texts:
        return values if values.type == at else values.cast(at), {}
    return _masked(at, us, values, outside), texts


def _wrap(value: int, bits: int) -> int:
    """``value`` in ``bits``-bit two's complement (undoing the driver's wrapping addition)."""
    full = 1 << bits
    value %= full
    return value - full if value >= full >> 1 else value


def _j2date(jd: int) -> tuple[int, int, int]:
    """PostgreSQL's ``j2date`` (``datetime.c``): Julian day -> (year, month, day); year <= 0 is BC."""
    julian = jd + 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = ((julian + 305) % 365 if y != 0 else (julian + 306) % 366) + 123
    y += quad * 4
    quad = julian * 2141 // 65536
    return y - 4800, (quad + 10) % 12 + 1, julian - 7834 * quad // 256


def _ymd(pg_days: int) -> tuple[str, bool]:
    year, month, day = _j2date(pg_days + _POSTGRES_EPOCH_JDATE)
    bc = year <= 0
    return f"{(1 - year) if bc else year:04d}-{month:02d}-{day:02d}", bc


def format_date(pg_days: int) -> str:
    """A ``date`` (days from 2000-01-01) as ``date_out`` prints it under ``DateStyle=ISO``."""
    if pg_days == _INT32_MAX:
        return "infinity"
    if pg_days == -_INT32_MAX - 1:
        return "-infinity"
    text, bc = _ymd(pg_days)
    return text + (" BC" if bc else "")


def format_timestamp(pg_us: int, *, zone: bool) -> str:
    """A ``timestamp``/``timestamptz`` (microseconds from 2000-01-01) as its output function prints it
    under ``DateStyle=ISO`` and ``TimeZone=UTC``: fractional seconds without trailing zeros, ``+00``, `` BC``."""
    if pg_us == _INT64_MAX:
        return "infinity"
    if pg_us == -_INT64_MAX - 1:
        return "-infinity"
    days, time = divmod(pg_us, 86_400_000_000)
    text, bc = _ymd(days)
    seconds, fraction = divmod(time, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text += f" {hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += "." + f"{fraction:06d}".rstrip("0")
    return text + ("+00" if zone else "") + (" BC" if bc else "")
