"""pgoutput Insert messages decoded column-wise: a run of inserts into one table straight to Arrow.

Why: the row-by-row fast path (:mod:`pgpoll.decode.pgoutput_tuples`) costs
about 10 µs of Python per change; a backlog of bulk inserts is mostly runs of
Insert messages of one relation, back to back. For such a run the layout of
every message is the same (``'I'``, relation id, ``'N'``, column count, then
per column a kind byte and, for ``'t'``, a length and the text), so the
offsets of column *k* in all messages follow from those of column *k-1* with
a few NumPy operations, and the values are gathered into one Arrow string
buffer without a Python object per value. The loop is over columns, never
over rows.

The result is exactly what the row path gives (the tests compare them value
for value): the ``after`` image as a ``map<string,string>`` with every column
of the relation in order, ``'n'`` as a null value, booleans printed
``true``/``false``. Anything else — a kind other than ``'t'``/``'n'`` (binary
values), a column count that differs from the relation's, a length that does
not end the message, text that is not UTF-8 — makes :func:`insert_run_after`
return ``None`` and the caller decodes the run row by row, where the checked
parser raises the precise error. Pure: no I/O.

:class:`PeekChunk` is a chunk of peeked rows laid out for this: one
contiguous byte buffer, each row's offsets, and :meth:`PeekChunk.insert_runs`
finds the runs worth decoding this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from pgpoll.decode.arrow_buffers import value_bytes, value_offsets
from pgpoll.decode.pgoutput_tuples import PgoutputRelation

__all__ = ["MAX_RUN_BYTES", "MIN_RUN", "Ints", "PeekChunk", "insert_run_after", "repeated_keys"]

#: Shorter runs go row by row: below this the fixed cost of the column-wise path is not worth it.
MIN_RUN = 16
#: A run is decoded in pieces of at most this many bytes of messages (bounded temporaries).
MAX_RUN_BYTES = 4 << 20

_I, _N, _T, _NULL = 73, 78, 116, 110  # 'I', 'N', 't', 'n'

Ints = npt.NDArray[np.int64]


def _be32(buf: npt.NDArray[np.uint8], at: Ints) -> Ints:
    """Big-endian unsigned 32-bit integers at offsets ``at`` (every ``at + 3`` inside ``buf``): one gather.

    Through a view of every 4-byte window of ``buf`` (no copy), so the gather's
    index has one entry per offset, not four (that index was a third of a run's time).
    """
    windows = sliding_window_view(buf, 4) if len(buf) >= 4 else np.zeros((0, 4), np.uint8)
    result: Ints = windows[at].view(">u4").ravel().astype(np.int64)
    return result


class PeekChunk:
    """The ``data`` of consecutive peeked rows in one buffer, with each row's start and end offset."""

    __slots__ = ("buf", "ends", "starts")

    def __init__(self, buf: npt.NDArray[np.uint8], starts: Ints, ends: Ints) -> None:
        self.buf, self.starts, self.ends = buf, starts, ends

    @classmethod
    def of_values(cls, datas: Sequence[Any]) -> PeekChunk:
        """From the rows' values (``bytes`` or buffers, as psycopg2 gives them): one copy into a new buffer."""
        lengths = np.fromiter(map(len, datas), np.int64, len(datas))
        ends = np.cumsum(lengths)
        return cls(np.frombuffer(b"".join(datas), np.uint8), ends - lengths, ends)

    @classmethod
    def of_arrow(cls, data: pa.Array[Any]) -> PeekChunk:
        """From an Arrow ``binary`` / ``large_binary`` column without nulls (ADBC's peek): no copy."""
        offsets = value_offsets(data)
        return cls(value_bytes(data), offsets[:-1], offsets[1:])

    def as_binary(self, lo: int, hi: int) -> pa.Array[Any]:
        """Rows ``lo..hi`` as an Arrow ``binary`` array over this buffer (no copy)."""
        base = int(self.starts[lo])
        offsets = np.append(self.starts[lo:hi], self.ends[hi - 1]) - base
        data: Any = self.buf[base : int(self.ends[hi - 1])]  # numpy arrays export the buffer protocol
        small: Any = offsets.astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), hi - lo, [None, pa.py_buffer(small), pa.py_buffer(data)])

    def value(self, row: int) -> bytes:
        """Row ``row``'s data as ``bytes``."""
        return self.buf[self.starts[row] : self.ends[row]].tobytes()

    def insert_runs(self, min_run: int = MIN_RUN) -> list[tuple[int, int, int]]:
        """``(first row, row after the last, relation id)`` of each run of at least ``min_run`` Inserts of one relation.

        Only messages without a transaction id (outside streaming) are
        recognised: ``'I'``, the relation id, ``'N'``. The relation id read
        here is checked against the decoder's cache by the caller.
        """
        n = len(self.starts)
        if n < min_run:
            return []
        long_enough = (self.ends - self.starts) >= 8  # 'I' + relid + 'N' + column count, at least
        at = np.where(long_enough, self.starts, 0)
        first = self.buf[at] if len(self.buf) else np.zeros(n, np.uint8)
        candidate = long_enough & (first == _I)
        if not candidate.any():
            return []
        relid = np.where(candidate, _be32(self.buf, np.where(candidate, at + 1, 0)), -1)
        cut = np.flatnonzero(relid[1:] != relid[:-1]) + 1  # where a new stretch of equal relation ids starts
        bounds = np.concatenate(([0], cut, [n]))
        runs: list[tuple[int, int, int]] = []
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            if hi - lo >= min_run and relid[lo] >= 0:
                runs.extend((a, b, int(relid[lo])) for a, b in self.pieces(lo, hi))
        return runs

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Rows ``lo..hi`` cut into pieces of at most :data:`MAX_RUN_BYTES` (at least one row each).

        The column-wise decoder's temporaries grow with a run's bytes (an
        index of 8 bytes per value byte), so a run is decoded a piece at a
        time: memory stays bounded whatever the values' size.
        """
        pieces = []
        while lo < hi:
            limit = self.starts[lo] + MAX_RUN_BYTES
            cut = int(np.searchsorted(self.ends[lo:hi], limit, side="right")) + lo
            cut = min(max(cut, lo + 1), hi)
            pieces.append((lo, cut))
            lo = cut
        return pieces


def insert_run_after(chunk: PeekChunk, lo: int, hi: int, rel: PgoutputRelation) -> pa.MapArray[Any, Any] | None:
    """The ``after`` images of the Insert messages in rows ``lo..hi`` of ``chunk``, or ``None`` to go row by row.

    Every message is checked as the row path checks it: ``'N'`` after the
    relation id, as many columns as ``rel`` has, each ``'t'`` or ``'n'``, the
    last value ending the message exactly, text valid UTF-8.

    The values' bytes are copied out of the run's buffer by one Arrow
    ``take`` over the buffer seen as alternating header and value strings
    (no pass in Python or NumPy over every byte), which keeps them in the
    buffer's order: row by row, column by column, the order of the map's items.
    """
    base = int(chunk.starts[lo])
    buf = chunk.buf[base : int(chunk.ends[hi - 1])]  # the run's bytes only (a view)
    ends = chunk.ends[lo:hi] - base
    n, width = hi - lo, rel.width
    if width == 0:
        return None  # (a table without columns: the row path)
    pos = chunk.starts[lo:hi] - base + 5
    if (buf[pos] != _N).any():
        return None
    if ((buf[pos + 1].astype(np.int64) << 8 | buf[pos + 2]) != width).any():
        return None
    pos = pos + 3
    starts, lengths, present = [], [], []  # per column (contiguous), stacked row-major below
    for _k in range(width):
        if (pos >= ends).any():
            return None
        kind = buf[pos]
        text = kind == _T
        if text.all():
            if (pos + 5 > ends).any():
                return None
            start, length = pos + 5, _be32(buf, pos + 1)
        else:
            if not (text | (kind == _NULL)).all() or (np.where(text, pos + 5, 0) > ends).any():
                return None
            start = np.where(text, pos + 5, pos + 1)  # a null is an empty value right after its 'n'
            length = np.where(text, _be32(buf, np.where(text, pos + 1, 0)), 0)
        starts.append(start)
        lengths.append(length)
        present.append(text)
        pos = start + length
    if (pos != ends).any() or len(buf) >= 2**31:
        return None
    count = n * width
    shape = (n, width)
    flat_starts = np.stack(starts, axis=1).ravel()  # row by row, column by column: the map's items in order
    flat_lengths = np.stack(lengths, axis=1).ravel()
    flat_present = np.stack(present, axis=1).ravel()
    # The run's bytes as alternating elements, header then value (their offsets are positions in the buffer, no
    # copy); taking every second one copies the values out in one pass of Arrow's.
    bounds = np.empty(2 * count + 1, np.int32)
    bounds[0] = 0
    bounds[1::2] = flat_starts
    bounds[2::2] = flat_starts + flat_lengths
    # numpy arrays export the buffer protocol (the stubs do not say so): no copy
    parts = pa.Array.from_buffers(pa.string(), 2 * count, [None, pa.py_buffer(bounds), pa.py_buffer(buf)])  # type: ignore[arg-type]
    values: Any = parts.take(_odd(count))
    nulls = count - int(flat_present.sum())
    if nulls:  # a null is an empty value right after its 'n': give it its validity bit
        _none, offsets, data = values.buffers()
        validity = pa.py_buffer(np.packbits(flat_present, bitorder="little"))  # type: ignore[arg-type]
        values = pa.StringArray.from_buffers(count, offsets, data, validity, nulls)
    try:
        values.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return None
    if rel.bool_indexes:
        values = _bool_text(values, buf, flat_starts.reshape(shape), flat_lengths.reshape(shape),
                            flat_present.reshape(shape), rel.bool_indexes)
    names = repeated_keys(rel.names, n)
    map_offsets: Any = pa.array(np.arange(0, count + 1, width, dtype=np.int32), pa.int32())
    return pa.MapArray.from_arrays(map_offsets, names, values)


#: Map keys (a relation's column names, repeated) already built, by column names: cut, not rebuilt, for every run.
_KEYS: dict[tuple[str, ...], pa.Array[Any]] = {}
#: At most this many keys are kept per relation, and :data:`_KEYS` is emptied past this many relations.
_KEYS_CACHED, _KEYS_RELATIONS = 1 << 20, 16


def _odd(count: int) -> pa.Array[Any]:
    """The indexes 1, 3, 5, ... of ``count`` values (a slice of a cached array for runs up to 64k values)."""
    if count > len(_ODD):
        return pa.array(np.arange(1, 2 * count, 2, dtype=np.int32))
    return _ODD.slice(0, count)


_ODD: pa.Array[Any] = pa.array(np.arange(1, 2 * 65536, 2, dtype=np.int32))


def repeated_keys(names: tuple[str, ...], n: int) -> pa.Array[Any]:
    """The map keys of ``n`` rows: ``names`` repeated ``n`` times (a zero-copy slice of a cached array).

    Building them is a ``take`` over the run's every value (an eighth of a
    run's time); a run of Inserts is mostly followed by more of one table.
    """
    width = len(names)
    cached = _KEYS.get(names)
    if cached is None or len(cached) < n * width:
        rows = max(n, min(1 << 16, _KEYS_CACHED // max(width, 1)))
        cached = pa.array(names, pa.string()).take(np.tile(np.arange(width, dtype=np.int32), rows))
        if len(cached) <= _KEYS_CACHED:
            if len(_KEYS) >= _KEYS_RELATIONS:
                _KEYS.clear()
            _KEYS[names] = cached
    return cached.slice(0, n * width)


def _bool_text(values: Any, buf: Any, starts: Any, lengths: Any, present: Any, columns: tuple[int, ...]) -> Any:
    """Boolean columns' ``t``/``f`` (boolout) as ``true``/``false`` (``bool::text``); any other text unchanged."""
    one = np.zeros(starts.shape, np.bool_)
    byte = np.zeros(starts.shape, np.uint8)
    for k in columns:
        one[:, k] = present[:, k] & (lengths[:, k] == 1)
        byte[:, k] = np.where(one[:, k], buf[np.where(one[:, k], starts[:, k], 0)], 0)
    true, false = one & (byte == _T), one & (byte == ord("f"))
    mask = (true | false).ravel()
    if not mask.any():
        return values
    words = pa.array(["false", "true"], pa.string()).take(pa.array(true.ravel()[mask].astype(np.int8)))
    return pc.replace_with_mask(values, pa.array(mask), words)
