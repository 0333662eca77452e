"""Bounds-checked big-endian reads of PostgreSQL protocol fields.

Two layers:

* precompiled ``struct`` unpackers, one name per width and signedness
  (``unpack_uint32``, ``unpack_int64``...), each ``unpack_from(buffer, offset)``
  returning a 1-tuple. They raise ``struct.error`` when the buffer is short, so
  only hot loops that check bounds themselves should use them directly;
* :class:`Reader`, a cursor over one protocol message that reads the
  protocol's field kinds (``Int8`` ... ``Int64``, ``String``, ``Byte(n)``) in
  order and raises :class:`pgpoll.errors.DecodeError` -- with the message type
  and the byte offset -- when a field runs past the end, a string has no
  terminating NUL or is not UTF-8. It never lets ``IndexError`` or
  ``struct.error`` escape.

PostgreSQL sends integers in network byte order. Which fields are signed is a
property of the field, not of the width: xids, OIDs and LSNs are unsigned;
timestamps and type modifiers are signed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Union

from pgpoll.errors import DecodeError

__all__ = [
    "PG_EPOCH",
    "Buffer",
    "Reader",
    "pg_timestamp",
    "unpack_int8",
    "unpack_int16",
    "unpack_int32",
    "unpack_int64",
    "unpack_uint8",
    "unpack_uint16",
    "unpack_uint32",
    "unpack_uint64",
]

#: What decoders accept: psycopg2 returns bytea as ``memoryview`` (format ``'c'``).
Buffer = Union[bytes, bytearray, "memoryview[Any]"]
_Unpack = Callable[[Buffer, int], tuple[int, ...]]

unpack_int8: _Unpack = struct.Struct("!b").unpack_from
unpack_uint8: _Unpack = struct.Struct("!B").unpack_from
unpack_int16: _Unpack = struct.Struct("!h").unpack_from
unpack_uint16: _Unpack = struct.Struct("!H").unpack_from
unpack_int32: _Unpack = struct.Struct("!i").unpack_from
unpack_uint32: _Unpack = struct.Struct("!I").unpack_from
unpack_int64: _Unpack = struct.Struct("!q").unpack_from
unpack_uint64: _Unpack = struct.Struct("!Q").unpack_from

#: PostgreSQL's timestamp epoch, 2000-01-01 00:00:00 UTC.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp(micros: int) -> datetime:
    """Convert PostgreSQL ``TimestampTz`` (µs since 2000-01-01 UTC) to an aware datetime.

    Raises :class:`DecodeError` when the value is outside what ``datetime``
    can hold (PostgreSQL's ``infinity`` among them).

    >>> pg_timestamp(0).isoformat()
    '2000-01-01T00:00:00+00:00'
    """
    try:
        return PG_EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        raise DecodeError(f"timestamp {micros} µs from 2000-01-01 is out of range") from None


class Reader:
    """A cursor over one protocol message.

    ``data`` is the whole message; reading starts at ``offset``.
    ``message_type`` names the message in errors (set it once the type byte is
    known). Offsets in errors are absolute byte offsets into ``data``.

    Non-``bytes`` input is copied once into ``bytes`` so string scans can use
    ``bytes.find``; field reads then slice a ``memoryview`` of it.

    >>> r = Reader(b"\\x00\\x00\\x00\\x2aab\\x00")
    >>> r.read_uint32(), r.read_string(), r.at_end()
    (42, 'ab', True)
    """

    __slots__ = ("_data", "_end", "_pos", "_view", "message_type")

    def __init__(self, data: Buffer, offset: int = 0, message_type: str | None = None) -> None:
        self._data = data if type(data) is bytes else bytes(data)
        self._view = memoryview(self._data)
        self._pos = offset
        self._end = len(self._data)
        self.message_type = message_type

    # ---- position -----------------------------------------------------------

    @property
    def pos(self) -> int:
        """Absolute offset of the next unread byte."""
        return self._pos

    @property
    def remaining(self) -> int:
        """Bytes left to read."""
        return self._end - self._pos

    def at_end(self) -> bool:
        """True when every byte has been read."""
        return self._pos == self._end

    def error(self, message: str, offset: int | None = None) -> DecodeError:
        """Build a DecodeError for this message (``offset`` defaults to the cursor)."""
        where = self._pos if offset is None else offset
        kind = self.message_type or "pgoutput"
        return DecodeError(
            f"{kind} message: {message} (at byte {where})",
            offset=where,
            message_type=self.message_type,
        )

    def _take(self, n: int, what: str) -> int:
        pos = self._pos
        if n < 0 or pos + n > self._end:
            raise self.error(f"{what} needs {n} bytes, {self._end - pos} left")
        self._pos = pos + n
        return pos

    def expect_end(self) -> None:
        """Raise when bytes are left over after the last field."""
        if self._pos != self._end:
            raise self.error(f"{self._end - self._pos} unexpected trailing bytes")

    # ---- integers -------------------------------------------------------------

    def read_int8(self, what: str = "Int8") -> int:
        """Signed Int8."""
        return unpack_int8(self._data, self._take(1, what))[0]

    def read_uint8(self, what: str = "Int8") -> int:
        """Unsigned Int8 (flags, kind bytes)."""
        return self._data[self._take(1, what)]

    def read_int16(self, what: str = "Int16") -> int:
        """Signed Int16."""
        return unpack_int16(self._data, self._take(2, what))[0]

    def read_uint16(self, what: str = "Int16") -> int:
        """Unsigned Int16 (column counts)."""
        return unpack_uint16(self._data, self._take(2, what))[0]

    def read_int32(self, what: str = "Int32") -> int:
        """Signed Int32 (type modifiers)."""
        return unpack_int32(self._data, self._take(4, what))[0]

    def read_uint32(self, what: str = "Int32") -> int:
        """Unsigned Int32 (xids, OIDs, lengths)."""
        return unpack_uint32(self._data, self._take(4, what))[0]

    def read_int64(self, what: str = "Int64") -> int:
        """Signed Int64 (timestamps)."""
        return unpack_int64(self._data, self._take(8, what))[0]

    def read_uint64(self, what: str = "Int64") -> int:
        """Unsigned Int64 (LSNs)."""
        return unpack_uint64(self._data, self._take(8, what))[0]

    def read_timestamp(self, what: str = "Int64 (TimestampTz)") -> datetime:
        """Int64 µs since 2000-01-01 UTC, as an aware datetime."""
        pos = self._pos
        micros = self.read_int64(what)
        try:
            return pg_timestamp(micros)
        except DecodeError:
            raise self.error(f"{what} {micros} is out of range", pos) from None

    # ---- bytes and strings --------------------------------------------------------

    def read_byte1(self, what: str = "Byte1") -> str:
        """One byte as a one-character string (``'N'``, ``'K'``...)."""
        return chr(self._data[self._take(1, what)])

    def read_bytes(self, n: int, what: str = "Byte(n)") -> bytes:
        """``Byte(n)``: exactly ``n`` bytes."""
        pos = self._take(n, what)
        return bytes(self._view[pos : pos + n])

    def read_string(self, what: str = "String") -> str:
        """``String``: NUL-terminated UTF-8 text (the NUL is consumed)."""
        pos = self._pos
        nul = self._data.find(b"\x00", pos, self._end)
        if nul < 0:
            raise self.error(f"{what} has no terminating NUL")
        self._pos = nul + 1
        try:
            return str(self._view[pos:nul], "utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"{what} is not valid UTF-8", pos + exc.start) from None
