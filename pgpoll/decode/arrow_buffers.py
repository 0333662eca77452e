"""NumPy views of an Arrow binary or string array's buffers: its values' offsets and bytes.

Why: the column-wise paths read Arrow's buffers directly instead of making a
Python object per value. They are pgoutput's and test_decoding's decoders
(:mod:`pgpoll.decode.pgoutput_columns`, :mod:`pgpoll.decode.text_columns`),
the peek's ``lsn``/``xid`` columns (:mod:`pgpoll.source.arrow_peek`) and the
typed rows' check of map keys (:mod:`pgpoll.sink.typed_columns`). Reading
them has two traps: a sliced array's offsets start at ``array.offset``, not
0, and a ``large_`` type has 64-bit offsets. They are handled here once.
Pure: no copy of the values, no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["value_bytes", "value_offsets"]


def value_offsets(array: pa.Array[Any]) -> npt.NDArray[np.int64]:
    """The ``len(array) + 1`` offsets of ``array``'s values into :func:`value_bytes`, as int64.

    Value ``i`` is ``value_bytes(array)[offsets[i]:offsets[i + 1]]``.
    """
    buffer = array.buffers()[1]
    assert buffer is not None, "a binary or string array has an offsets buffer"
    width = np.int64 if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type) else np.int32
    raw = np.frombuffer(memoryview(buffer), width)[array.offset : array.offset + len(array) + 1]
    offsets: npt.NDArray[np.int64] = raw.astype(np.int64)
    return offsets


def value_bytes(array: pa.Array[Any]) -> npt.NDArray[np.uint8]:
    """``array``'s data buffer as bytes (no copy; empty when it has none); :func:`value_offsets` index it."""
    buffer = array.buffers()[2]
    return np.frombuffer(memoryview(buffer), np.uint8) if buffer is not None else np.zeros(0, np.uint8)
