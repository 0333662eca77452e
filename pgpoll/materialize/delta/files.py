"""Which files of a Delta state an incremental run rewrites, and the layout that keeps them few.

Layout. A keyed table's state is range-partitioned on its key and sorted
within each partition, and Spark splits a partition's output into files of
at most :data:`TARGET_ROWS` rows (``maxRecordsPerFile``). A file therefore
holds one contiguous stretch of keys, and the ``minValues``/``maxValues`` of
the key columns pgpoll writes into its add action (see
:class:`pgpoll.materialize.delta.table.DataFile`) bound it tightly. Keys that
grow (serials, ids from a sequence, timestamps) put inserts and updates of
recent rows into the last files; random keys spread over all of them.

Why :data:`TARGET_ROWS` is 262,144 rows and not the 128 MB-1 GB that Delta's
compaction aims for: a file is the unit an incremental run rewrites, so its
size is the granularity of the incremental cost. At 6 narrow columns a
quarter million rows is about 5-10 MB, at 50 wide ones about 100 MB; a
100M-row table has about 400 files, few enough for readers that plan from
the log's statistics (delta-rs, DuckDB, Spark) and fine enough that a run
touching the newest 1% of keys rewrites a file or two, not a quarter of the
table. Multiset tables (no usable key) are written with the same file bound
but no order: they are always rewritten whole.

Exactness. For a keyed table the new state of a key depends only on the
changes at that key, the previous row at that key, and, for a row that moved
to a new key with unchanged TOAST values, the previous row at its old key
(:mod:`pgpoll.materialize.state`). So when an incremental run reads only the
files that may hold a *touched* key (the new key, and the ``_before.`` key,
of every INSERT, UPDATE and DELETE), computes their new content from the
changes, and leaves every other file as it is, the result is the one a full
rewrite gives: every other key keeps its previous row unchanged. A file may
hold a touched key when, on every key column, the key lies within the file's
``[min, max]``; files with a null in a key column (a key the typed column
cannot hold, e.g. ``infinity`` kept raw in ``_untyped``) and empty files are
always rewritten. The comparison runs in Spark (the touched keys joined with
a broadcast frame of the files' ranges; only file paths come back), so it
scales with the changes, not the state.

The partial rewrite is used only when that argument holds
(:func:`refusal` names the first reason it does not): an incremental run
whose previous state was written for the same key, a keyed table, statistics
for every key column in every file (integers, strings and dates: the types
whose order in Delta's statistics is Spark's), one replica-identity stretch,
no TRUNCATE, and an unchanged schema (``append`` keeps the Delta schema, and
kept files must read like the new ones). Otherwise every file is rewritten,
as a ``--full`` run does.

Not done: rewritten files are laid out over the whole key range of what was
rewritten, so when the files rewritten are not neighbours (random updates),
a new file's range may span a kept file's and both are rewritten by the
next run that touches a key there (the layout mends itself then).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pgpoll.materialize.delta.table import DataFile
from pgpoll.materialize.state import StateColumn, _frame_columns, _value
from pgpoll.typed.mapping import spark_ddl
from pgpoll.typed.rows import quote

TARGET_ROWS = 262_144
"""The most rows Spark writes into one file of a keyed state (see the module docstring)."""


@dataclass(frozen=True)
class PartialPlan:
    """An incremental run's split of the pinned version's files: those it rewrites and those it keeps."""

    affected: tuple[DataFile, ...]
    kept: tuple[DataFile, ...]
    shape: tuple[tuple[str, str], ...] = ()
    """The pinned files' columns (:func:`schema_shape`): the new files must have the same to be committed beside them."""
    rest: Callable[[], Any] | None = None
    """The kept files' rows as a state frame (read only if the new state's schema turns out to differ)."""

    def counts(self, added: int) -> dict[str, int]:
        """``{"rewritten", "added", "kept"}`` file counts of the commit (for ``materialize --json``)."""
        return {"rewritten": len(self.affected), "added": added, "kept": len(self.kept)}


def has_key_stats(f: DataFile, key: Sequence[str]) -> bool:
    """True when the log bounds every key column of ``f``: a record count, a null count, and min and max
    unless the column is null in every row (an empty file needs nothing more than its count)."""
    if f.records <= 0:
        return f.records == 0
    for k in key:
        if k not in f.null_count:
            return False
        if (k not in f.min_values or k not in f.max_values) and f.null_count[k] < f.records:
            return False
    return True


def always_rewritten(f: DataFile, key: Sequence[str]) -> bool:
    """True for files no key range describes: empty ones, and those with a null in a key column."""
    return f.records == 0 or any(f.null_count.get(k, 0) > 0 for k in key)


def refusal(files: Sequence[DataFile], key: Sequence[str], previous_key: Sequence[str], *, truncated: bool,
            identity_changes: bool, same_schema: bool) -> str | None:
    """Why an incremental run must rewrite every file (None: the partial rewrite is exact; see the module docstring)."""
    checks = [
        (not key, "the table has no key"),
        (list(previous_key) != list(key), "the previous state was written for another key"),
        (truncated, "a TRUNCATE"),
        (identity_changes, "the replica identity changed"),
        (not same_schema, "the schema changed"),
        (not files, "the previous version has no file"),
        (any(not has_key_stats(f, key) for f in files), "a file without statistics for the key"),
    ]
    return next((why for failed, why in checks if failed), None)


def range_rows(files: Iterable[DataFile], key: Sequence[str]) -> list[tuple[Any, ...]]:
    """``(path, lo0, hi0, lo1, hi1, ...)`` of the files a key range describes (not :func:`always_rewritten`)."""
    return [
        (f.path, *[v for k in key for v in (f.min_values[k], f.max_values[k])])
        for f in files if not always_rewritten(f, key)
    ]


@dataclass(frozen=True)
class ChangeScan:
    """What one pass over an incremental run's changes found (:func:`scan_changes`)."""

    truncated: bool
    """A TRUNCATE is among them."""
    shapes: int
    """Distinct column descriptions (``_schema_id``) they were written under."""
    changes: int
    """INSERTs, UPDATEs and DELETEs (counted once per file their new key may be in: a bound, not a count)."""
    touched: frozenset[str]
    """The paths of the files that may hold a key they touch."""


def scan_changes(spark: Any, events: Any, columns: Sequence[StateColumn], key: Sequence[str],
                 files: Sequence[DataFile]) -> ChangeScan:
    """One Spark pass over ``events``: the paths of ``files`` that may hold a key an INSERT, UPDATE or DELETE
    touches (its new key, and its ``_before.`` key), and what else decides whether a partial rewrite is exact.

    The files' ranges are a literal frame (no Python worker), broadcast and
    joined with the touched keys; only the aggregate comes back.
    """
    from pyspark.sql import functions as F

    by_name = {c.name: c for c in columns}
    typed = [by_name[k] for k in key]
    have = _frame_columns(events)
    sides = [F.struct(*[_value(have, c).alias(f"k{i}") for i, c in enumerate(typed)])]
    if "_before" in events.columns:
        sides.append(F.when(F.col("_before").isNotNull(),
                            F.struct(*[_value(have, c, "_before.").alias(f"k{i}") for i, c in enumerate(typed)])))
    keyed = F.col("_op").isin("I", "U", "D")
    scanned = events.select("_op", "_schema_id", F.posexplode(F.array(*sides)).alias("__pgpoll_side", "__pgpoll_t"))
    rows = range_rows(files, key)
    if rows:
        ddl = [spark_ddl(c.type) for c in typed]
        ranges = spark.range(1).select(F.inline(F.array(*[
            F.struct(F.lit(r[0]).alias("path"), *[
                F.lit(v).cast(ddl[j // 2]).alias(f"{('lo', 'hi')[j % 2]}{j // 2}") for j, v in enumerate(r[1:])])
            for r in rows
        ])))
        inside = keyed & functools.reduce(operator.and_, [
            (F.col(f"__pgpoll_t.k{i}") >= ranges[f"lo{i}"]) & (F.col(f"__pgpoll_t.k{i}") <= ranges[f"hi{i}"])
            for i in range(len(typed))
        ])
        scanned = scanned.join(F.broadcast(ranges), inside, "left")
    else:
        scanned = scanned.withColumn("path", F.lit(None).cast("string"))
    found = scanned.agg(
        F.max((F.col("_op") == "T").cast("int")).alias("t"), F.count_distinct("_schema_id").alias("s"),
        F.count(F.when(keyed & (F.col("__pgpoll_side") == 0), 1)).alias("n"), F.collect_set("path").alias("p"),
    ).first()
    always = {f.path for f in files if always_rewritten(f, key)}
    return ChangeScan(bool(found["t"]), int(found["s"] or 0), int(found["n"] or 0),
                      frozenset(always | {str(p) for p in found["p"] or ()}))


def laid_out(frame: Any, key: Sequence[str], rows_estimate: int | None) -> Any:
    """``frame`` range-partitioned on ``key`` and sorted within partitions (write it with :func:`write_options`).

    ``rows_estimate`` (None: unknown) sets the number of partitions, one per
    :data:`TARGET_ROWS`, rounded (a single partition is the frame coalesced
    into one, sorted: no sampling job and no shuffle of its own, which is most
    of a small table's write; ``maxRecordsPerFile`` splits a larger
    partition's sorted output into contiguous files, the last one small until
    a later run touches it); unknown, Spark's adaptive execution merges
    neighbouring ranges. The file bound holds either way.
    """
    from pyspark.sql import functions as F

    if not key:
        return frame
    cols = [F.col(quote(k)) for k in key]
    if rows_estimate is None:
        spread = frame.repartitionByRange(*cols)
    elif (parts := max(1, round(rows_estimate / TARGET_ROWS))) == 1:
        spread = frame.coalesce(1)  # one range is the whole frame: no sampling job, no shuffle of its own
    else:
        spread = frame.repartitionByRange(parts, *cols)
    return spread.sortWithinPartitions(*cols)


def write_options() -> dict[str, str]:
    """The options of the Parquet write of a laid-out state (the file bound)."""
    return {"maxRecordsPerFile": str(TARGET_ROWS)}


def schema_shape(spark_schema: Any) -> list[tuple[str, str]]:
    """Names and types of a frame's columns, nullability aside (what must match for files to be kept)."""
    return [(f.name, f.dataType.simpleString()) for f in spark_schema.fields]
