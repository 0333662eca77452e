"""test_decoding INSERT lines decoded column-wise: a run of inserts into one table straight to Arrow.

Why: parsing a test_decoding line costs microseconds of Python (a regex
match, then a dict per row); a backlog of bulk inserts is mostly runs of
lines that start alike, ``table public.t: INSERT:``, followed by the same
`` name[type]:`` separators. Once the first line of a run is decoded the row
way (which checks it and caches its column layout), the rest of the run is
cut at those separators with NumPy (no Python per row): every byte is told
prefix, separator or value, the separators' bytes must be exactly the
layout's and the values' bytes become one Arrow string array in the map's
order. What a bulk insert mostly prints — numbers, and quoted literals with
no quote inside — is taken as it stands: the quotes are counted over the
run (exactly two per quoted value, at its ends) and the unquoted tokens'
bytes compared (digits, one ``.``, a leading ``-``), and each value is the
slice between its quotes, so no regex and no unquoting pass run. Any other
run is checked value by value against the grammar test_decoding prints
(``print_literal``, as :mod:`pgpoll.decode.text_values` reads it) with an
anchored RE2 match, and unquoted with Arrow compute. The separators and
values are copied out of the buffer by Arrow ``take`` s over the lines seen
as consecutive pieces, not by masks over every byte.

Exact, not approximate: every separator ends in ``]:``, so one pass over
the bytes finds them all; a line where that pair turns up more or less often
than the layout has columns (a value holding ``]:``, another column list)
is not cut at all, each cut must be exactly the separator's text, and each
piece between must be one whole value token. Any failure, an
unchanged-TOAST marker or text that is not UTF-8 makes
:func:`insert_run_after` return ``None`` and the caller decodes the run row
by row. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.decode.arrow_buffers import value_bytes, value_offsets
from pgpoll.decode.pgoutput_columns import PeekChunk, repeated_keys

__all__ = ["insert_run_after", "same_prefix_run"]

_BARE = r"null|true|false|NaN|-?Infinity|[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
#: One whole value token (RE2 syntax): what ``_VALUE`` of text_values accepts, less the unchanged-TOAST marker.
_TOKEN = r"^(?:'[^']*(?:''[^']*)*'|B'[01]*'|" + _BARE + r")$"
_BRACKET, _COLON = ord("]"), ord(":")
_QUOTED = r"^'[^']*(?:''[^']*)*'$"
_QUOTE, _MINUS, _DOT, _ZERO = ord("'"), ord("-"), ord("."), ord("0")


def same_prefix_run(chunk: PeekChunk, lo: int, hi: int, prefix: bytes) -> int:
    """The first row in ``lo..hi`` (or ``hi``) whose data does not start with ``prefix``."""
    if lo >= hi:
        return lo
    try:
        pattern = prefix.decode()
    except UnicodeDecodeError:
        return lo  # not UTF-8: the row path reports it
    same = np.asarray(pc.starts_with(chunk.as_binary(lo, hi), pattern=pattern))
    return lo + (int(np.argmin(same)) if not same.all() else hi - lo)


def _value(tokens: Any) -> pa.Array[Any] | None:
    """Tokens to values as the row path gives them: unquoted, ``B'..'`` stripped, ``null`` as NULL.

    A column of only quoted literals (text, dates...) or only bare tokens
    (numbers, booleans) takes the short way; a mix, the general one.
    """
    quoted = pc.starts_with(tokens, "'")
    count = pc.sum(quoted).as_py() or 0
    if count == len(tokens):
        if not pc.all(pc.match_substring_regex(tokens, _QUOTED)).as_py():
            return None
        inner = pc.utf8_slice_codeunits(tokens, 1, -1)
        if pc.any(pc.match_substring(inner, "''")).as_py():
            inner = pc.replace_substring(inner, "''", "'")
        fixed: pa.Array[Any] = inner
        return fixed
    if not pc.all(pc.match_substring_regex(tokens, _TOKEN)).as_py():
        return None
    values = tokens
    if count:
        values = pc.if_else(quoted, pc.replace_substring(pc.utf8_slice_codeunits(tokens, 1, -1), "''", "'"), tokens)
    bits = pc.starts_with(tokens, "B'")
    if pc.any(bits).as_py():
        values = pc.if_else(bits, pc.utf8_slice_codeunits(tokens, 2, -1), values)
    nulls = pc.equal(tokens, pa.scalar("null"))
    if pc.any(nulls).as_py():
        values = pc.if_else(nulls, pa.scalar(None, pa.string()), values)
    result: pa.Array[Any] = values
    return result


def _plain_quoted(buf: Any, value_starts: Any, value_ends: Any) -> Any | None:
    """Which values are quoted (an int array shaped like the bounds), when every quoted one is plain, else ``None``.

    Plain: a quoted literal with no quote inside (``'name-1'``, a date) —
    its value is the slice between the quotes, what :func:`_value` (hence the
    row path) makes of it, so it needs no regex and no unquoting pass. Proved
    by counting: the run holds exactly two quote bytes per quoted value and
    each quoted value starts and ends with one, so there is no other quote in
    the run at all. (Unquoted values are checked by :func:`_plain_numbers`.)
    """
    quoted = buf[value_starts] == _QUOTE
    closed = (buf[value_ends - 1] == _QUOTE) & (value_ends - value_starts >= 2)
    if not (closed | ~quoted).all() or np.count_nonzero(buf == _QUOTE) != 2 * np.count_nonzero(quoted):
        return None
    return quoted.astype(np.int64)


def _plain_numbers(tokens: Any) -> bool:
    """Whether every one of the (unquoted, nonempty) ``tokens`` is digits with at most one ``.`` and a leading ``-``.

    Those are tokens the grammar takes as they are (``_BARE``): integers and
    numerics, what a bulk insert mostly prints. Checked over the tokens' bytes
    with comparisons (no regex, no Python per token); anything else (``null``,
    ``true``, bits, ``NaN``, exponents, ``+``) makes the run take :func:`_value`.
    """
    if not len(tokens):
        return True
    offsets = value_offsets(tokens)
    data = value_bytes(tokens)[offsets[0] : offsets[-1]]
    starts = offsets[:-1] - offsets[0]
    dot, minus = data == _DOT, data == _MINUS
    if not ((data - np.uint8(_ZERO) < 10) | dot | minus).all():
        return False
    at_start = np.zeros(len(data), np.bool_)
    at_start[starts] = True
    if (minus & ~at_start).any():
        return False  # a "-" after a token's first byte
    token = np.searchsorted(starts, np.flatnonzero(dot), side="right") - 1
    if (np.diff(token) == 0).any():
        return False  # two dots in one token
    digits = np.diff(offsets) - np.bincount(token, minlength=len(tokens)) - minus[starts]
    return bool((digits >= 1).all())


def _cut(buf: Any, starts: Any, begins: Any, value_starts: Any, separators: list[bytes],
         inner: tuple[Any, Any] | None = None, quoted: Any = None) -> Any | None:
    """The values of every line as one Arrow string array in the map's order, or ``None`` when a separator is
    not the layout's or a value is not UTF-8.

    Each line is seen as consecutive pieces of the buffer — the prefix, then
    per column its separator and its value (with ``inner``, the value's
    ``(starts, ends)`` within its token: the opening quote, the value, and the
    closing quote as pieces of their own, and the unquoted values must be
    :func:`_plain_numbers`) — whose offsets are the buffer's own
    positions (no copy); Arrow's take copies out the separators (to compare
    with the layout's) and the values, in the buffer's order: row by row,
    column by column, the map's order.
    """
    n, width = value_starts.shape
    step = 2 if inner is None else 4
    per_line = 1 + step * width
    bounds = np.empty((n, per_line), np.int32)
    bounds[:, 0] = starts
    bounds[:, 1::step] = begins
    bounds[:, 2::step] = value_starts
    if inner is not None:
        bounds[:, 3::4], bounds[:, 4::4] = inner
    offsets = np.append(bounds.ravel(), np.int32(len(buf)))
    # numpy arrays export the buffer protocol (the stubs do not say so): no copy
    pieces = pa.Array.from_buffers(pa.binary(), n * per_line, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])  # type: ignore[arg-type]
    index = np.arange(n * per_line, dtype=np.int32).reshape(n, per_line)
    seen: Any = pieces.take(index[:, 1::step].ravel())
    expected = np.frombuffer(b"".join(separators), np.uint8)  # (each separator was cut at the layout's length)
    if not (np.frombuffer(seen.buffers()[2], np.uint8).reshape(n, len(expected)) == expected).all():
        return None  # another column name or type
    values = index[:, (2 if inner is None else 3)::step].ravel()
    if quoted is not None and not _plain_numbers(pieces.take(values[quoted.ravel() == 0])):
        return None
    taken = pieces.take(values).buffers()
    tokens: Any = pa.Array.from_buffers(pa.string(), n * width, taken)
    try:
        tokens.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return None
    return tokens


def insert_run_after(
    chunk: PeekChunk, lo: int, hi: int, prefix_length: int, layout: Sequence[tuple[str, str]], names: Sequence[str]
) -> pa.MapArray[Any, Any] | None:
    """The ``after`` images of the INSERT lines in rows ``lo..hi``, or ``None`` to go row by row.

    Every line starts with the same ``table ...: INSERT:`` prefix of
    ``prefix_length`` bytes (:func:`same_prefix_run`); ``layout`` is the
    printed ``(name, type)`` of each column as the first line of the run
    showed them, ``names`` the column names as the row path gives them.
    """
    n, width = hi - lo, len(layout)
    if n <= 0 or width == 0:
        return None
    base = int(chunk.starts[lo])
    buf = chunk.buf[base : int(chunk.ends[hi - 1])]
    starts = chunk.starts[lo:hi] - base
    ends = chunk.ends[lo:hi] - base
    if len(buf) >= 2**31:
        return None
    separators = [f" {name}[{kind}]:".encode() for name, kind in layout]
    # Every separator ends in "]:"; find them all in one pass over the bytes.
    colon = np.flatnonzero(buf == _COLON)
    colon = colon[colon > 0]
    colon = colon[buf[colon - 1] == _BRACKET]
    if len(colon) != n * width:
        return None  # a value holds "]:", or a line has another column count: row by row
    found = colon.reshape(n, width)  # positions ascend and lines follow each other: row i's, if each is in line i
    if (found[:, 0] < starts + prefix_length).any() or (found[:, -1] >= ends).any():
        return None  # row i's first and last lie in line i past its prefix, hence all of them: as many in each line
    sizes = np.array([len(sep) for sep in separators], np.int64)
    begins = found - (sizes - 1)  # where each separator starts
    if (begins[:, 0] != starts + prefix_length).any() or (begins[:, 1:] <= found[:, :-1] + 1).any():
        return None
    value_starts = found + 1  # (n, width)
    value_ends = np.empty_like(found)
    value_ends[:, :-1] = begins[:, 1:]
    value_ends[:, -1] = ends
    if ((value_ends - value_starts) <= 0).any():
        return None
    quoted = _plain_quoted(buf, value_starts, value_ends)  # the common case: values are slices, nothing to unquote
    items = None if quoted is None else _cut(buf, starts, begins, value_starts, separators,
                                             (value_starts + quoted, value_ends - quoted), quoted)
    if items is None:  # a value that is not plain (or not the layout, or not UTF-8: the general way declines too)
        tokens = _cut(buf, starts, begins, value_starts, separators)
        items = None if tokens is None else _value(tokens)
    if items is None:
        return None
    keys = repeated_keys(tuple(names), n)
    map_offsets: Any = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32), pa.int32())
    return pa.MapArray.from_arrays(map_offsets, keys, items)

