"""Tests for the bounds-checked protocol reader (pgpoll.decode.wire)."""

from __future__ import annotations

import pickle
import struct
from datetime import UTC, datetime

import pytest

from pgpoll.decode import wire
from pgpoll.decode.wire import Reader, pg_timestamp
from pgpoll.errors import DecodeError


def test_unpackers_are_big_endian_with_separate_signedness() -> None:
    data = b"\xff\xff\xff\xff\xff\xff\xff\xfe"
    assert wire.unpack_uint8(data, 0) == (255,)
    assert wire.unpack_int8(data, 0) == (-1,)
    assert wire.unpack_uint16(data, 0) == (65535,)
    assert wire.unpack_int16(data, 0) == (-1,)
    assert wire.unpack_uint32(data, 0) == (0xFFFFFFFF,)
    assert wire.unpack_int32(data, 0) == (-1,)
    assert wire.unpack_uint64(data, 0) == (0xFFFFFFFFFFFFFFFE,)
    assert wire.unpack_int64(data, 0) == (-2,)
    assert wire.unpack_uint32(b"\x00\x00\x40\x01", 0) == (16385,)


def test_reads_fields_in_order() -> None:
    data = (
        b"\x07"
        + struct.pack("!hHiIqQ", -2, 65534, -3, 4000000000, -5, 2**64 - 1)
        + "zoë\x00".encode()
        + b"raw"
    )
    r = Reader(data)
    assert r.read_uint8() == 7
    assert r.read_int16() == -2
    assert r.read_uint16() == 65534
    assert r.read_int32() == -3
    assert r.read_uint32() == 4000000000
    assert r.read_int64() == -5
    assert r.read_uint64() == 2**64 - 1
    assert r.read_string() == "zoë"
    assert r.remaining == 3
    assert r.read_bytes(3) == b"raw"
    assert r.at_end()
    r.expect_end()


def test_accepts_memoryview_bytearray_and_offset() -> None:
    payload = b"Xab\x00\x01"
    for data in (payload, bytearray(payload), memoryview(payload), memoryview(payload).cast("c")):
        r = Reader(data, 1)
        assert r.read_string() == "ab"
        assert r.read_byte1() == "\x01"
        assert r.pos == 5


def test_int8_signed_and_unsigned() -> None:
    assert Reader(b"\x80").read_int8() == -128
    assert Reader(b"\x80").read_uint8() == 128


@pytest.mark.parametrize(
    ("method", "width"),
    [
        ("read_int8", 1),
        ("read_uint8", 1),
        ("read_int16", 2),
        ("read_uint16", 2),
        ("read_int32", 4),
        ("read_uint32", 4),
        ("read_int64", 8),
        ("read_uint64", 8),
        ("read_byte1", 1),
        ("read_timestamp", 8),
    ],
)
def test_short_buffer_raises_decode_error_with_offset(method: str, width: int) -> None:
    data = b"H" + b"\x00" * (width - 1)
    r = Reader(data, 1, "Begin")
    with pytest.raises(DecodeError) as info:
        getattr(r, method)()
    err = info.value
    assert err.offset == 1
    assert err.message_type == "Begin"
    assert "Begin message" in str(err)
    assert f"needs {width} bytes, {width - 1} left" in str(err)
    assert r.pos == 1  # a failed read does not move the cursor


def test_read_bytes_bounds() -> None:
    r = Reader(b"abc", 1, "Message")
    with pytest.raises(DecodeError) as info:
        r.read_bytes(3, "content")
    assert info.value.offset == 1
    assert "content needs 3 bytes, 2 left" in str(info.value)
    with pytest.raises(DecodeError):
        r.read_bytes(-1)
    assert r.read_bytes(0) == b""


def test_string_without_nul_raises() -> None:
    r = Reader(b"Rpublic", 1, "Relation")
    with pytest.raises(DecodeError) as info:
        r.read_string("namespace")
    assert info.value.offset == 1
    assert "namespace has no terminating NUL" in str(info.value)


def test_string_that_is_not_utf8_raises_at_the_bad_byte() -> None:
    r = Reader(b"Yab\xff\x00", 1, "Type")
    with pytest.raises(DecodeError) as info:
        r.read_string("type name")
    assert info.value.offset == 3
    assert "not valid UTF-8" in str(info.value)


def test_expect_end_reports_trailing_bytes() -> None:
    r = Reader(b"E\x00\x00", 1, "Stream Stop")
    with pytest.raises(DecodeError) as info:
        r.expect_end()
    assert info.value.offset == 1
    assert "2 unexpected trailing bytes" in str(info.value)


def test_timestamps_are_utc_microseconds_since_2000() -> None:
    assert pg_timestamp(0) == datetime(2000, 1, 1, tzinfo=UTC)
    assert pg_timestamp(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    micros = 817_898_645_123_456
    ts = pg_timestamp(micros)
    assert ts == datetime(2025, 12, 1, 10, 4, 5, 123456, tzinfo=UTC)
    assert ts.tzinfo is UTC
    assert Reader(struct.pack("!q", micros)).read_timestamp() == ts


def test_out_of_range_timestamp_raises_decode_error() -> None:
    infinity = 2**63 - 1  # PostgreSQL's DT_NOEND
    with pytest.raises(DecodeError):
        pg_timestamp(infinity)
    r = Reader(b"C" + struct.pack("!q", infinity), 1, "Commit")
    with pytest.raises(DecodeError) as info:
        r.read_timestamp("commit timestamp")
    assert info.value.offset == 1
    assert info.value.message_type == "Commit"


def test_decode_error_pickles_with_offset() -> None:
    with pytest.raises(DecodeError) as info:
        Reader(b"I", 1, "Insert").read_uint32("relation OID")
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, DecodeError)
    assert (again.offset, again.message_type, str(again)) == (1, "Insert", str(info.value))
