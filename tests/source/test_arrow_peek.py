"""The ADBC peek's ``lsn`` and ``xid`` columns, read from their binary wire form (pure: no server).

The server sends ``pg_lsn`` as a big-endian int64 and ``xid`` as a
big-endian uint32; adbc-driver-postgresql hands both over as opaque binary
values. The equality of the whole ADBC path with psycopg2's, which asks the
server for numbers, is proven on a real server in
``tests/ingest/test_column_inserts.py``; here the edges no small workload
reaches: ids past 2^31, LSNs past 4 GiB of WAL, a sliced batch, a driver that
maps the types, and forms that must be refused.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from pgpoll.source.arrow_peek import _as_int64


def _opaque(type_name: str, values: list[bytes | None]) -> pa.Array:
    return pa.ExtensionArray.from_storage(pa.opaque(pa.binary(), type_name, "PostgreSQL"), pa.array(values, pa.binary()))


def test_lsns_are_big_endian_64_bit_integers() -> None:
    lsns = [0x1506630, 0x1_0000_0000, 0x7FFF_FFFF_FFFF_FFF0]
    column = _opaque("pg_lsn", [struct.pack(">q", v) for v in lsns])
    assert _as_int64(column, "lsn").to_pylist() == lsns
    assert _as_int64(column, "lsn").type == pa.int64()


def test_xids_are_unsigned_32_bit_integers() -> None:
    xids = [0, 727, 2**31, 2**32 - 2]  # an id past 2^31 must not turn negative
    column = _opaque("xid", [struct.pack(">I", v) for v in xids])
    assert _as_int64(column, "xid").to_pylist() == xids


def test_a_sliced_column_reads_its_own_values() -> None:
    column = _opaque("xid", [struct.pack(">I", v) for v in range(10, 20)])
    assert _as_int64(column.slice(3, 4), "xid").to_pylist() == [13, 14, 15, 16]
    assert _as_int64(column.slice(10), "xid").to_pylist() == []


def test_integers_from_a_driver_that_maps_the_types_are_cast() -> None:
    assert _as_int64(pa.array([1, 2**31], pa.uint32()), "xid").to_pylist() == [1, 2**31]


@pytest.mark.parametrize(
    ("values", "why"),
    [([struct.pack(">I", 1), struct.pack(">q", 2)], "bytes wide"), ([struct.pack(">I", 1), None], "nulls: 1")],
)
def test_a_form_it_cannot_read_is_refused(values: list[bytes | None], why: str) -> None:
    with pytest.raises(pa.ArrowInvalid, match=why):
        _as_int64(_opaque("xid", values), "xid")


def test_another_type_is_refused() -> None:
    with pytest.raises(pa.ArrowInvalid, match="arrived as string"):
        _as_int64(pa.array(["0/1"]), "lsn")
