"""The current state of one table from its typed changes, computed with Spark DataFrames.

Keyed tables (a replica-identity key that is not every column): each change
becomes *facts* about keys — INSERT and UPDATE put the new row at the new
key, DELETE and an UPDATE that changes the key mark the old key gone — and a
key's state is its last fact in ``(commit_lsn, seq)`` order, kept when it is
a row. The previous state enters as facts older than every change.

Unchanged TOAST values (UPDATEs that did not send a large value) are
carried forward: the value is the last known one at the same key, found with
a window over the key — unless a row moved in to that key after it whose own
value is still unresolved, which must be resolved first; a row that moved to
a new key in that UPDATE takes the old key's last value. Rounds repeat until
nothing more can be resolved (one round unless rows with unchanged large
values change key). A value that is not known anywhere (it predates the
captured history) is left null and counted.

A key is the typed key values plus, for values the typed column cannot hold
(``infinity``, NaN), their exact text. Working columns are named
``__pgpoll_*`` so that they cannot meet a table's own columns.

Tables whose identity is every column (REPLICA IDENTITY FULL without a
smaller key, or no usable key) are multisets: each row's count is the
previous count plus INSERTs minus DELETEs (an UPDATE is both), so identical
rows are kept as many times as the source holds them.

A TRUNCATE empties the table as of its position: the previous state and
every earlier change are dropped.

On top of a snapshot (:mod:`pgpoll.materialize.visibility`), ``previous`` is
the snapshot's rows (or a state built on it) and only changes invisible to
the snapshot of their key's chunk are facts; a TRUNCATE empties only the
chunks it is invisible to. Unchanged TOAST values are then filled from the
snapshot's row, which is a fact like any other, and, where no chunk and no
change holds them (a row moved between chunks while they were read), from
the snapshot's recheck rows (:mod:`pgpoll.materialize.recheck_fill`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.materialize.change_summary import ChangeSummary
from pgpoll.materialize.recheck_fill import RecheckRows, fill_from_rechecks
from pgpoll.materialize.visibility import Position, SnapshotFilter, position_struct
from pgpoll.typed.mapping import PgType, spark_ddl
from pgpoll.typed.rows import quote


@dataclass(frozen=True)
class StateColumn:
    """One column of the state: its name there, its type, and every physical column it was ever stored in."""

    name: str
    type: PgType
    physical: tuple[str, ...]  # the current physical name first


@dataclass
class ComputedState:
    """A table's new state and what it was computed from: a Spark ``frame`` or, computed in the driver
    (:mod:`pgpoll.materialize.driver.state`), an Arrow ``table``."""

    described: Any  # the TableSchema the state's columns follow
    key: list[str]
    warnings: list[str]
    unresolved_toast: int
    frame: Any = None
    table: Any = None


@dataclass
class StateResult:
    """The new state and what could not be resolved: ``unresolved_toast`` counts the facts left without a value
    (as the driver engine counts them); ``unresolved_rows``, computed where the snapshot's recheck rows were
    used, the rows of the new state among them (a row that moved on from a fact without a value has its own)."""

    frame: Any
    unresolved_toast: int = 0
    unresolved_rows: int | None = None


def _value(frame_columns: set[str], column: StateColumn, prefix: str = "") -> Any:
    """The column's value in the latest type, from whichever physical column holds it."""
    from pyspark.sql import functions as F

    ddl = spark_ddl(column.type)
    parts = []
    for i, phys in enumerate(column.physical):
        if (prefix + phys) not in frame_columns:
            continue
        ref = F.col(prefix + quote(phys)) if not prefix else F.col(f"{prefix[:-1]}.{quote(phys)}")
        parts.append(ref if i == 0 else ref.cast(ddl))
    if not parts:
        return F.lit(None).cast(ddl)
    return parts[0] if len(parts) == 1 else F.coalesce(*parts)


def _frame_columns(frame: Any) -> set[str]:
    names = set(frame.columns)
    if "_before" in names:
        names |= {f"_before.{f.name}" for f in frame.schema["_before"].dataType.fields}
    return names


def materialize(
    events: Any | None, previous: Any | None, columns: Sequence[StateColumn], key: Sequence[str],
    snapshot: SnapshotFilter | None = None, summary: ChangeSummary | None = None,
    rechecks: RecheckRows | None = None,
) -> StateResult:
    """The new state from ``previous`` (a state frame, or None) and ``events`` (typed changes, or None).

    ``key`` names the identity columns; empty (REPLICA IDENTITY FULL, or
    no key) means the table is treated as a multiset. With ``snapshot``,
    ``events`` carry ``_xid`` and only changes invisible to the snapshot
    (of their key's chunk) are applied (see the module docstring).
    ``summary`` (:func:`pgpoll.materialize.change_summary.summarize` of
    ``events``, without a snapshot) answers the last TRUNCATE and the
    unchanged-TOAST columns without a Spark job of their own. ``rechecks``:
    the snapshot's recheck rows, where unchanged TOAST values no chunk holds
    are found (keyed tables).
    """
    from pyspark.sql import functions as F

    multiset = not key
    placed: tuple[SnapshotFilter, list[Position | None]] | None = None
    known = summary if snapshot is None else None  # a snapshot filters the changes first: ask them again
    toasted: set[str] | None = None
    if events is not None:
        if snapshot is not None and snapshot.shared:
            events = events.where(~F.coalesce(snapshot.visible(F.lit(0), F.col("_xid")), F.lit(False)))
        if snapshot is None or snapshot.shared:
            last_truncate = (known.last_truncate if known is not None else
                             events.where(F.col("_op") == "T").agg(F.max(F.struct("_commit_lsn", "_seq"))).first()[0])
            toasted = known.toasted_after(last_truncate) if known is not None else None
            if last_truncate is not None:
                previous = None
                lsn, seq = last_truncate
                events = events.where((F.col("_commit_lsn") > lsn) | ((F.col("_commit_lsn") == lsn) & (F.col("_seq") > seq)))
        else:
            truncates = [(int(r[0]), int(r[1]), None if r[2] is None else int(r[2]))
                         for r in events.where(F.col("_op") == "T").select("_commit_lsn", "_seq", "_xid").collect()]
            placed = (snapshot, snapshot.cutoffs(truncates))
        events = events.where(F.col("_op").isin("I", "U", "D"))
    if events is None:
        if previous is None:
            raise ValueError("nothing to materialize")
        return StateResult(previous)
    have = _frame_columns(events)
    untyped_main = F.map_filter("_untyped", lambda k, v: ~k.startswith("_before."))
    row = [_value(have, c).alias(c.name) for c in columns]
    old = [_value(have, c, "_before.").alias(c.name) for c in columns]
    old_untyped = F.map_from_entries(
        F.transform(
            F.filter(F.map_entries(F.coalesce("_untyped", F.create_map().cast("map<string,string>"))),
                     lambda e: e["key"].startswith("_before.")),
            lambda e: F.struct(F.substring(e["key"], 9, 1 << 20).alias("key"), e["value"].alias("value")),
        )
    )
    if multiset:
        return StateResult(_multiset(events, previous, columns, row, old, untyped_main, old_untyped, placed))
    return _keyed(events, previous, columns, list(key), row, old, untyped_main, have, placed, toasted, rechecks)


def _xid(events: Any) -> Any:
    from pyspark.sql import functions as F

    return (F.col("_xid") if "_xid" in events.columns else F.lit(None)).cast("bigint").alias("__pgpoll_x")


def _place(facts: Any, placed: tuple[SnapshotFilter, list[Position | None]] | None, field: Any) -> Any:
    """Only the facts the snapshot does not hold yet (``field(name)``: a key column of the fact)."""
    from pyspark.sql import functions as F

    if placed is None:
        return facts
    snap, cutoffs = placed
    facts = facts.withColumn("__pgpoll_c", snap.chunk_of(field))
    # (__pgpoll_x stays: the recheck rows' visibility needs it; the state's columns are selected by name)
    return facts.where(snap.keep(F.col("__pgpoll_c"), F.col("__pgpoll_x"), position_struct(), cutoffs)).drop("__pgpoll_c")


def _sortable(untyped: Any) -> Any:
    from pyspark.sql import functions as F

    return F.array_sort(F.map_entries(F.coalesce(untyped, F.create_map().cast("map<string,string>"))))


def _multiset(events: Any, previous: Any | None, columns: Sequence[StateColumn], row: list[Any], old: list[Any],
              untyped_main: Any, old_untyped: Any, placed: tuple[SnapshotFilter, list[Position | None]] | None) -> Any:
    from pyspark.sql import functions as F

    names = [c.name for c in columns]
    # an UPDATE's unchanged TOAST values are the old row's (FULL identity sends the whole old row)
    new_values = [
        F.when(F.array_contains(F.coalesce("_unchanged_toast", F.array().cast("array<string>")), c.name), o).otherwise(r)
        .alias(c.name)
        for c, r, o in zip(columns, row, old, strict=True)
    ]
    meta = ["_commit_lsn", "_seq", "_commit_ts", _xid(events)]
    plus = events.where(F.col("_op").isin("I", "U")).select(
        *new_values, _sortable(untyped_main).alias("__pgpoll_u"), F.lit(1).alias("__pgpoll_n"), *meta)
    minus_updates = events.where((F.col("_op") == "U") & F.col("_before").isNotNull()).select(
        *old, _sortable(old_untyped).alias("__pgpoll_u"), F.lit(-1).alias("__pgpoll_n"), *meta)
    minus_deletes = events.where(F.col("_op") == "D").select(
        *row, _sortable(untyped_main).alias("__pgpoll_u"), F.lit(-1).alias("__pgpoll_n"), *meta)
    facts = plus.unionByName(minus_updates).unionByName(minus_deletes)
    if previous is not None:
        facts = facts.unionByName(previous.select(
            *[F.col(quote(n)) for n in names], _sortable(F.col("_untyped")).alias("__pgpoll_u"), F.lit(1).alias("__pgpoll_n"),
            F.coalesce(F.col("_commit_lsn"), F.lit(-1).cast("bigint")).alias("_commit_lsn"), F.lit(-1).alias("_seq"),
            "_commit_ts", F.lit(None).cast("bigint").alias("__pgpoll_x")))
    facts = _place(facts, placed, lambda k: F.col(quote(k)))
    counted = facts.groupBy(*[F.col(quote(n)) for n in names], "__pgpoll_u").agg(
        F.sum("__pgpoll_n").alias("__pgpoll_count"),
        F.max(F.when(F.col("_commit_lsn") >= 0, F.col("_commit_lsn"))).alias("_commit_lsn"),
        F.max("_commit_ts").alias("_commit_ts"))
    kept = counted.where(F.col("__pgpoll_count") > 0).withColumn(
        "__pgpoll_copy", F.explode(F.array_repeat(F.lit(1), F.col("__pgpoll_count").cast("int"))))
    untyped = F.when(F.size("__pgpoll_u") > 0, F.map_from_entries("__pgpoll_u")).otherwise(F.lit(None).cast("map<string,string>"))
    return kept.select(*[F.col(quote(n)) for n in names], untyped.alias("_untyped"), "_commit_lsn", "_commit_ts")


def _keyed(events: Any, previous: Any | None, columns: Sequence[StateColumn], key: list[str], row: list[Any],
           old: list[Any], untyped_main: Any, have: set[str],
           placed: tuple[SnapshotFilter, list[Position | None]] | None, toasted: set[str] | None = None,
           rechecks: RecheckRows | None = None) -> StateResult:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [c.name for c in columns]
    if placed is not None and not set(placed[0].key) <= set(key):
        raise SinkError(f"the snapshot's chunks follow ({', '.join(placed[0].key)}), not the key changes are matched by "
                        f"({', '.join(key)})", "run `pgpoll snapshot` again for the table (its replica identity changed)")
    ev = events.select(
        "_op", "_commit_lsn", "_seq", "_commit_ts", _xid(events),
        F.coalesce("_unchanged_toast", F.array().cast("array<string>")).alias("__pgpoll_toast"),
        F.struct(*row).alias("__pgpoll_new"), F.struct(*old).alias("__pgpoll_old"),
        F.col("_before").isNotNull().alias("__pgpoll_has_old"),
        untyped_main.alias("__pgpoll_u"),
        F.coalesce("_untyped", F.create_map().cast("map<string,string>")).alias("__pgpoll_all_u"),
    )
    # a key holds the typed values and, for values the typed column cannot hold (NaN, infinity), their exact text
    new_key = F.struct(*[F.col("__pgpoll_new." + quote(k)).alias(k) for k in key],
                       *[F.element_at("__pgpoll_all_u", F.lit(k)).alias(f"__pgpoll_raw{i}") for i, k in enumerate(key)])
    old_key = F.when(F.col("__pgpoll_has_old"), F.struct(
        *[F.col("__pgpoll_old." + quote(k)).alias(k) for k in key],
        *[F.element_at("__pgpoll_all_u", F.lit("_before." + k)).alias(f"__pgpoll_raw{i}") for i, k in enumerate(key)],
    )).otherwise(new_key)
    ev = ev.withColumn("__pgpoll_nk", new_key).withColumn("__pgpoll_ok", old_key)
    values = [F.col("__pgpoll_new." + quote(n)).alias(n) for n in names]
    gone = [F.lit(None).cast(spark_ddl(c.type)).alias(c.name) for c in columns]
    rows = ev.where(F.col("_op").isin("I", "U")).select(
        F.col("__pgpoll_nk").alias("__pgpoll_k"), "_commit_lsn", "_seq", F.lit(1).alias("__pgpoll_sub"),
        F.lit(True).alias("__pgpoll_alive"), *values,
        "__pgpoll_toast", "__pgpoll_u", "_commit_ts", "__pgpoll_x",
        F.when((F.col("_op") == "U") & (~F.col("__pgpoll_ok").eqNullSafe(F.col("__pgpoll_nk"))), F.col("__pgpoll_ok"))
        .alias("__pgpoll_src"),
    )
    moved_away = ev.where(
        ((F.col("_op") == "U") & (~F.col("__pgpoll_ok").eqNullSafe(F.col("__pgpoll_nk")))) | (F.col("_op") == "D")
    ).select(
        F.col("__pgpoll_ok").alias("__pgpoll_k"), "_commit_lsn", "_seq", F.lit(0).alias("__pgpoll_sub"),
        F.lit(False).alias("__pgpoll_alive"), *gone,
        F.array().cast("array<string>").alias("__pgpoll_toast"), F.lit(None).cast("map<string,string>").alias("__pgpoll_u"),
        "_commit_ts", "__pgpoll_x", F.lit(None).cast(ev.schema["__pgpoll_nk"].dataType).alias("__pgpoll_src"),
    )
    facts = rows.unionByName(moved_away)
    if previous is not None:
        facts = facts.unionByName(previous.select(
            F.struct(*[F.col(quote(k)).alias(k) for k in key],
                     *[F.element_at(F.coalesce("_untyped", F.create_map().cast("map<string,string>")), F.lit(k))
                       .alias(f"__pgpoll_raw{i}") for i, k in enumerate(key)]).alias("__pgpoll_k"),
            F.coalesce(F.col("_commit_lsn"), F.lit(-1).cast("bigint")).alias("_commit_lsn"), F.lit(-1).alias("_seq"),
            F.lit(1).alias("__pgpoll_sub"),
            F.lit(True).alias("__pgpoll_alive"), *[F.col(quote(n)) for n in names],
            F.array().cast("array<string>").alias("__pgpoll_toast"), F.col("_untyped").alias("__pgpoll_u"), "_commit_ts",
            F.lit(None).cast("bigint").alias("__pgpoll_x"),
            F.lit(None).cast(ev.schema["__pgpoll_nk"].dataType).alias("__pgpoll_src"),
        ))
    facts = _place(facts, placed, lambda k: F.col("__pgpoll_k." + quote(k)))
    if toasted is None:
        toasted = {r[0] for r in events.select(F.explode("_unchanged_toast")).distinct().collect()}
    resolved = [n for n in names if n in toasted]
    unresolved = 0
    if resolved:
        facts, unresolved = _resolve_toast(facts, resolved, rechecks=rechecks, key=key)
    order = Window.partitionBy("__pgpoll_k").orderBy(F.desc("_commit_lsn"), F.desc("_seq"), F.desc("__pgpoll_sub"))
    latest = facts.withColumn("__pgpoll_rank", F.row_number().over(order)).where(
        (F.col("__pgpoll_rank") == 1) & F.col("__pgpoll_alive"))
    open_rows = None
    if unresolved and rechecks is not None:  # what counts then is the rows of the new state left without a value
        latest = latest.localCheckpoint()
        open_rows = latest.where(F.col("__pgpoll_open")).count()
    return StateResult(
        latest.select(*[F.col(quote(n)) for n in names], F.col("__pgpoll_u").alias("_untyped"),
                      F.when(F.col("_commit_lsn") >= 0, F.col("_commit_lsn")).alias("_commit_lsn"), "_commit_ts"),
        unresolved, open_rows,
    )


def _other_than(name: str) -> Any:
    from pyspark.sql import functions as F

    return lambda k, v: k != F.lit(name)


def _resolve_toast(facts: Any, toasted: list[str], rounds: int = 8, rechecks: RecheckRows | None = None,
                   key: Sequence[str] = ()) -> tuple[Any, int]:
    """Fill unchanged TOAST values from the row's earlier value (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    prior = (
        Window.partitionBy("__pgpoll_k").orderBy("_commit_lsn", "_seq", "__pgpoll_sub")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    known = {n: f"__pgpoll_kn{i}" for i, n in enumerate(toasted)}
    position = F.struct("_commit_lsn", "_seq", "__pgpoll_sub")
    for n, flag in known.items():
        facts = facts.withColumn(flag, ~F.array_contains("__pgpoll_toast", n))
        raw = F.element_at(F.coalesce("__pgpoll_u", F.create_map().cast("map<string,string>")), F.lit(n))
        facts = facts.withColumn(f"{flag}_raw", raw).withColumn("__pgpoll_u", F.map_filter("__pgpoll_u", _other_than(n)))
    if rechecks is not None:
        facts = fill_from_rechecks(facts, rechecks, key, known)
    previous_unknown = unknown = -1
    for _ in range(rounds):
        for n, flag in known.items():
            # the last known value before this fact at the key — unless a row moved in after it whose own
            # value is still unresolved (then it waits for the next round); moved-in rows take theirs from the old key
            carried = F.last(F.when(F.col(flag), F.struct(F.col(quote(n)).alias("v"), F.col(f"{flag}_raw").alias("r"),
                                                          position.alias("p"))), ignorenulls=True).over(prior)
            blocker = F.max(F.when(~F.col(flag) & F.col("__pgpoll_src").isNotNull(), position)).over(prior)
            facts = (
                facts.withColumn(f"{flag}_c", carried).withColumn(f"{flag}_b", blocker)
                .withColumn(f"{flag}_p", F.when(F.col(f"{flag}_c").isNotNull() & (
                    F.col(f"{flag}_b").isNull() | (F.col(f"{flag}_b") < F.col(f"{flag}_c")["p"])), F.col(f"{flag}_c")))
                .drop(f"{flag}_c", f"{flag}_b")
            )
        # rows moved to a new key in an UPDATE: their old key's value just before the move
        sources = facts.where(F.col("__pgpoll_sub") == 0).select(
            F.col("__pgpoll_k").alias("__pgpoll_src"), F.col("_commit_lsn").alias("__pgpoll_s_lsn"),
            F.col("_seq").alias("__pgpoll_s_seq"),
            *[F.col(f"{flag}_p").alias(f"{flag}_s") for flag in known.values()],
        )
        facts = facts.join(
            sources,
            (facts["__pgpoll_src"] == sources["__pgpoll_src"]) & (facts["_commit_lsn"] == sources["__pgpoll_s_lsn"])
            & (facts["_seq"] == sources["__pgpoll_s_seq"]),
            "left",
        ).drop(sources["__pgpoll_src"]).drop("__pgpoll_s_lsn", "__pgpoll_s_seq")
        for n, flag in known.items():
            found = F.when(F.col("__pgpoll_src").isNull(), F.col(f"{flag}_p")).otherwise(F.col(f"{flag}_s"))
            fill = ~F.col(flag) & found.isNotNull()
            facts = (
                facts.withColumn(n, F.when(fill, found["v"]).otherwise(F.col(quote(n))))
                .withColumn(f"{flag}_raw", F.when(fill, found["r"]).otherwise(F.col(f"{flag}_raw")))
                .withColumn(flag, F.col(flag) | fill)
                .drop(f"{flag}_p", f"{flag}_s")
            )
        facts = facts.localCheckpoint()
        unknown = facts.where(F.col("__pgpoll_alive") & ~F.array_min(F.array(*[F.col(f) for f in known.values()]))).count()
        if unknown == 0 or unknown == previous_unknown:
            break
        previous_unknown = unknown
    # the raw texts of resolved values go back into the row's untyped map
    for n, flag in known.items():
        entry = F.when(F.col(f"{flag}_raw").isNotNull(), F.create_map(F.lit(n), F.col(f"{flag}_raw")))
        facts = facts.withColumn(
            "__pgpoll_u",
            F.when(entry.isNotNull(), F.map_concat(F.coalesce("__pgpoll_u", F.create_map().cast("map<string,string>")), entry))
            .otherwise(F.col("__pgpoll_u")))
    # a row whose value is still unknown (its count is the rows of the state that lack a value, see _keyed)
    every = F.array_min(F.array(*[F.col(f) for f in known.values()]))
    facts = facts.withColumn("__pgpoll_open", F.col("__pgpoll_alive") & ~every)
    facts = facts.drop(*known.values(), *[f"{f}_raw" for f in known.values()])
    return facts, max(unknown, 0)
