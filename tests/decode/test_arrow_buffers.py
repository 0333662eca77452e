"""NumPy views of an Arrow binary or string array's buffers: offsets that index the bytes, whatever the slice."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgpoll.decode.arrow_buffers import value_bytes, value_offsets


def _values(array: pa.Array) -> list[bytes]:
    offsets, data = value_offsets(array), value_bytes(array)
    return [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(array))]


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_offsets_index_the_bytes_also_of_a_slice(kind: pa.DataType) -> None:
    raw = [b"a", b"", b"bcd", b"ef", b"ghij"]
    array = pa.array([v.decode() for v in raw] if pa.types.is_string(kind) or pa.types.is_large_string(kind) else raw,
                     kind)
    assert _values(array) == raw
    assert _values(array.slice(2, 2)) == raw[2:4]
    assert value_offsets(array.slice(2, 2)).tolist() == [1, 4, 6]  # positions in the whole buffer, not from 0
    assert value_offsets(array).dtype == "int64"


def test_an_array_of_empty_values_has_no_bytes() -> None:
    array = pa.array([b"", b""], pa.binary())
    assert value_offsets(array).tolist() == [0, 0, 0]
    assert len(value_bytes(array)) == 0
    assert _values(pa.array([], pa.binary())) == []
