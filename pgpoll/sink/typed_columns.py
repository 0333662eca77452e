"""Envelope rows of one table -> typed change rows, column by column with Arrow compute.

The same result as :func:`pgpoll.typed.rows.typed_batch` (a test holds them
equal), without a Python object per row: each column's text is taken out of
the ``before``/``after`` maps with ``map_lookup``, and text Arrow's own
parsers read exactly as PostgreSQL prints it (integers, floats, booleans,
``date``, ``timestamp``, ``timestamptz`` with its offset) is converted by an
Arrow cast. When a cast refuses some value of a column (``NaN`` in a decimal,
``infinity``, a BC date, an offset with seconds...), that column goes through
:func:`pgpoll.typed.conversions.to_arrow` value by value, which keeps the
exact text of what the typed type cannot hold in ``_untyped``. Columns whose
typed type is the text itself (text, uuid, json, unconstrained numeric...)
are passed through as they are.

About 3 µs per row and column where the cast applies, against some 30 µs per
row for the per-row path (``bench/bench_typed.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.decode.arrow_buffers import value_bytes, value_offsets
from pgpoll.typed.conversions import to_arrow
from pgpoll.typed.mapping import PgType, arrow_type
from pgpoll.typed.rows import TypedLayout, assemble_typed_batch

#: Kinds whose text an Arrow cast reads exactly as PostgreSQL prints it, or fails on.
_CAST_KINDS = frozenset({"bool", "int2", "int4", "int8", "oid", "float4", "float8", "date", "timestamp", "timestamptz"})
_UNTYPED = pa.map_(pa.string(), pa.string())


def column_to_arrow(t: PgType, texts: pa.Array[Any]) -> tuple[pa.Array[Any], list[int]]:
    """A string column of value texts -> (the typed array, the fallback row indexes), as :func:`to_arrow`."""
    at = arrow_type(t)
    if at == pa.string():
        return texts, []  # the exact text is the typed value
    if t.kind in _CAST_KINDS:
        try:
            return texts.cast(at), []
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # some value is not plain: value by value, with fallbacks
    return to_arrow(t, texts.to_pylist())


_ENTRIES = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())]))


class _Images:
    """A map<string,string> column, indexed once so that each key's values come out with a few vector calls.

    (``map_lookup`` scans every row's keys per lookup; here one comparison over
    all keys finds a column's entries, and a ``take`` puts them in their rows.)
    """

    def __init__(self, images: pa.Array[Any]) -> None:
        entries: Any = images.cast(_ENTRIES)  # pyarrow-stubs type the cast result as a plain Array
        flat: Any = pc.list_flatten(entries)
        self.keys = flat.field("key")
        self.values = flat.field("value")
        self.parents = pc.list_parent_indices(entries).to_numpy()
        self.rows = len(images)
        self.regular = self._regular(entries)

    def _regular(self, entries: Any) -> dict[str, int] | None:
        """Key -> position when every row's map holds the same keys in the same order (a run of INSERTs: the
        usual batch), so that a key's values are every k-th value; None otherwise."""
        if not self.rows or entries.null_count:
            return None
        lengths = pc.list_value_length(entries).to_numpy(zero_copy_only=False)
        k = int(lengths[0])
        if k == 0 or bool((lengths != k).any()):
            return None
        names = self.keys.slice(0, k).to_pylist()
        if len(set(names)) != k or not _rows_repeat(self.keys, k):
            return None
        return {str(name): i for i, name in enumerate(names)}

    def lookup(self, name: str) -> pa.Array[Any]:
        """Each row's value of key ``name`` (null where the map is null or lacks the key)."""
        if self.regular is not None:
            at = self.regular.get(name)
            if at is None:
                return pa.nulls(self.rows, pa.string())
            step = len(self.regular)
            taken: pa.Array[Any] = self.values.take(pa.array(np.arange(at, self.rows * step, step, dtype=np.int64)))
            return taken
        found = pc.equal(self.keys, pa.scalar(name))
        where = np.flatnonzero(found.to_numpy(zero_copy_only=False))
        index = np.full(self.rows, -1, dtype=np.int64)
        index[self.parents[where]] = where
        missing = index < 0
        if missing.all():
            return pa.nulls(self.rows, pa.string())
        found_values: pa.Array[Any] = self.values.take(pa.array(index, pa.int64(), mask=missing))
        return found_values


def _rows_repeat(keys: Any, k: int) -> bool:
    """Whether every row's ``k`` keys are the first row's, byte for byte: their lengths, then their bytes.

    Compared as NumPy views of the key strings' offsets and bytes (no string
    is built or copied): a row's keys lie back to back, so with equal lengths
    every row spans as many bytes as the first, and the bytes form a matrix.
    """
    offsets = value_offsets(keys)
    lengths = np.diff(offsets).reshape(-1, k)
    if bool((lengths != lengths[0]).any()):
        return False
    width = int(lengths[0].sum())
    if width == 0:
        return True
    rows = value_bytes(keys)[offsets[0] : offsets[0] + len(lengths) * width].reshape(-1, width)
    return not bool((rows != rows[0]).any())


def typed_columns_batch(batch: pa.RecordBatch, layout: TypedLayout) -> pa.RecordBatch:
    """Envelope rows (of one table) as typed change rows (see :mod:`pgpoll.typed.rows`)."""
    n = batch.num_rows
    op = batch.column("op")
    before, after, sids = batch.column("before"), batch.column("after"), batch.column("schema_id")
    is_d = pc.equal(op, pa.scalar("D"))
    is_iu = pc.or_(pc.equal(op, pa.scalar("I")), pc.equal(op, pa.scalar("U")))
    has_old = pc.and_(pc.equal(op, pa.scalar("U")), pc.is_valid(before))
    untyped: dict[int, list[tuple[str, str]]] = {}
    own_main: list[pa.Array[Any]] = []
    own_old: list[pa.Array[Any]] = []
    old_images, new_images = _Images(before), _Images(after)
    # the usual batch is all INSERTs and UPDATEs without old rows: then no row's text needs choosing
    only_new = pc.all(is_iu).as_py() is True
    any_old = pc.any(has_old).as_py() is True
    no_text = pa.scalar(None, pa.string())
    for phys, name, t in layout.columns:
        holders = [sid for sid, names in layout.physical.items() if names.get(name) == phys]
        holds: Any = pc.fill_null(pc.is_in(sids, pa.array(holders, pa.string())), pa.scalar(False))
        all_hold = pc.all(holds).as_py() is True
        if only_new:
            main_text = new_images.lookup(name)
            old_text = pc.if_else(has_old, old_images.lookup(name), no_text) if any_old else pa.nulls(n, pa.string())
        else:
            old_text = old_images.lookup(name)
            main_text = pc.if_else(is_d, old_text, pc.if_else(is_iu, new_images.lookup(name), no_text))
            old_text = pc.if_else(has_old, old_text, no_text)
        for texts, arrays, prefix in ((main_text, own_main, ""), (old_text, own_old, "_before.")):
            if not all_hold:
                texts = pc.if_else(holds, texts, pa.scalar(None, pa.string()))
            array, fallback = column_to_arrow(t, texts)
            for i in fallback:
                text = texts[i].as_py()
                if text is not None:
                    untyped.setdefault(i, []).append((prefix + name, text))
            arrays.append(array)
    target = layout.arrow_schema()
    before_type = target.field("_before").type
    if layout.columns:
        before_col = pa.StructArray.from_arrays(own_old, fields=list(before_type), mask=pc.invert(has_old))
    else:
        before_col = pa.nulls(n, before_type)
    untyped_col = pa.array([untyped.get(i) for i in range(n)], _UNTYPED) if untyped else pa.nulls(n, _UNTYPED)
    return assemble_typed_batch(batch, target, own_main, before_col, untyped_col)
