"""Which files of a large Delta state an incremental run in the driver rewrites (pure).

The same decision as :mod:`pgpoll.materialize.delta.files` makes with a Spark
join, for the case where the changes are small and only the state is large
(updates of recent rows in a big table): the keys the changes touch (each
change's new key, and the old key of a key-changing UPDATE) are compared
with the files' key ranges from the Delta log here, in Python. A file may
hold a touched key when every key column lies within its ``[min, max]``;
files without a key range (empty, or a null in a key column) are always
rewritten. Only the files that may hold a touched key are read and
rewritten (:mod:`pgpoll.materialize.driver.state` replays the changes over
their rows); the others stay in the new version untouched.

Whether the choice is exact at all is :func:`pgpoll.materialize.delta.files.refusal`'s
question, as for Spark. Kept to what compares in Python exactly as in Spark:
key columns of integer and string types (UTF-8 byte order is code point
order). Anything else — dates, more than :data:`MAX_COMPARISONS` file-by-key
comparisons for a composite key — goes to Spark.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pgpoll.materialize.delta.files import always_rewritten
from pgpoll.materialize.delta.table import DataFile

#: The most comparisons of touched keys with file ranges for a composite key (a single column is bisected).
MAX_COMPARISONS = 5_000_000


def comparable_key(schema: pa.Schema, key: Sequence[str]) -> bool:
    """Whether every key column is an integer or a string (their order in Delta's statistics is Python's)."""
    return all(pa.types.is_integer(schema.field(k).type) or pa.types.is_string(schema.field(k).type) for k in key)


def touched_files(files: Sequence[DataFile], key: Sequence[str], keys: set[tuple[Any, ...]]) -> set[str] | None:
    """The paths of ``files`` that may hold one of ``keys`` (typed key values; None components never fall in a
    range), files without a range included; None when a composite key needs too many comparisons."""
    out = {f.path for f in files if always_rewritten(f, key)}
    ranged = [f for f in files if not always_rewritten(f, key)]
    present = [k for k in keys if all(v is not None for v in k)]
    if len(key) == 1:
        values = sorted(k[0] for k in present)
        for f in ranged:
            lo, hi = f.min_values[key[0]], f.max_values[key[0]]
            at = bisect.bisect_left(values, lo)
            if at < len(values) and values[at] <= hi:
                out.add(f.path)
        return out
    if len(ranged) * len(present) > MAX_COMPARISONS:
        return None
    for f in ranged:
        bounds = [(f.min_values[k], f.max_values[k]) for k in key]
        if any(all(lo <= v <= hi for v, (lo, hi) in zip(k, bounds, strict=True)) for k in present):
            out.add(f.path)
    return out
