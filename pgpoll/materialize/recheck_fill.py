"""Unchanged TOAST values that no chunk and no change holds, filled from the snapshot's recheck rows.

The case and why the recheck finds it are in :mod:`pgpoll.snapshot.recheck`.
Here: a recheck row is the row at key *k* as of its piece's snapshot *V*.
The facts of *k* that materialize keeps on top of the snapshot (the chunk's
row, older than every change, and the changes its chunk's snapshot did not
see) are ordered by commit position, which for one key is also the order in
which transactions became visible (a change to a row waits for the previous
change of that key to end). So the *last* of them whose transaction *V*
sees -- the chunk's row counts as seen -- produced exactly the row version
*V* read: its values are the recheck row's. Only the values that fact lacks
(the unchanged TOAST columns no change or chunk row gave it) are filled
from it; the carrying forward of :mod:`pgpoll.materialize.state` then takes
them to later facts and to the keys the row moves to. Nothing is filled
from a recheck row whose target fact already knows its values, and nothing
else changes, so a recheck row can never make a state wrong that was right.

This needs every transaction *V* sees in the change log: materialize
applies recheck rows only once the change log has passed the snapshot's
convergence LSN (after every recheck piece), and rebuilds the table from
the snapshot until then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgpoll.materialize.visibility import visible_in
from pgpoll.typed.rows import quote
from pgpoll.xids import Snapshot


@dataclass(frozen=True)
class RecheckRows:
    """The recheck rows of one table as a state-shaped Spark frame (its columns, ``_untyped``) with
    ``__pgpoll_r``, the index of each row's piece in ``snapshots``."""

    frame: Any
    snapshots: tuple[Snapshot, ...]


def key_struct(key: Sequence[str]) -> Any:
    """A state row's key as the facts' ``__pgpoll_k``: the typed key values and their exact texts (``_untyped``)."""
    from pyspark.sql import functions as F

    untyped = F.coalesce("_untyped", F.create_map().cast("map<string,string>"))
    return F.struct(*[F.col(quote(k)).alias(k) for k in key],
                    *[F.element_at(untyped, F.lit(k)).alias(f"__pgpoll_raw{i}") for i, k in enumerate(key)])


def fill_from_rechecks(facts: Any, rechecks: RecheckRows, key: Sequence[str], known: Mapping[str, str]) -> Any:
    """``facts`` (:func:`pgpoll.materialize.state._resolve_toast`'s, with a ``known`` flag and ``_raw`` text per
    TOAST column) with the missing values of each recheck row's target fact filled (see the module docstring)."""
    from pyspark.sql import functions as F

    position = F.struct("_commit_lsn", "_seq", "__pgpoll_sub")
    rows = rechecks.frame.select(key_struct(key).alias("__pgpoll_k"), "__pgpoll_r", *[quote(n) for n in known],
                                 F.coalesce("_untyped", F.create_map().cast("map<string,string>")).alias("__pgpoll_ru"))
    keys = rows.select("__pgpoll_k", "__pgpoll_r").distinct()
    seen = visible_in(rechecks.snapshots, F.col("__pgpoll_r"), F.col("__pgpoll_x"))
    targets = (
        facts.select("__pgpoll_k", position.alias("__pgpoll_p"), "__pgpoll_x")
        .join(keys, "__pgpoll_k")
        .where(F.col("__pgpoll_x").isNull() | F.coalesce(seen, F.lit(False)))
        .groupBy("__pgpoll_k", "__pgpoll_r").agg(F.max("__pgpoll_p").alias("__pgpoll_p"))
    )
    values = (
        rows.join(targets, ["__pgpoll_k", "__pgpoll_r"])
        .groupBy("__pgpoll_k", "__pgpoll_p")  # two pieces that read the same version: either one
        .agg(F.first(F.struct(*[F.col(quote(n)).alias(f"v{i}") for i, n in enumerate(known)],
                              *[F.element_at("__pgpoll_ru", F.lit(n)).alias(f"r{i}") for i, n in enumerate(known)]))
             .alias("__pgpoll_rv"))
        .select(F.col("__pgpoll_k").alias("__pgpoll_rk"), F.col("__pgpoll_p")["_commit_lsn"].alias("__pgpoll_rl"),
                F.col("__pgpoll_p")["_seq"].alias("__pgpoll_rs"), F.col("__pgpoll_p")["__pgpoll_sub"].alias("__pgpoll_rb"),
                "__pgpoll_rv")
    )
    facts = facts.join(
        values,
        (facts["__pgpoll_k"] == values["__pgpoll_rk"]) & (facts["_commit_lsn"] == values["__pgpoll_rl"])
        & (facts["_seq"] == values["__pgpoll_rs"]) & (facts["__pgpoll_sub"] == values["__pgpoll_rb"]),
        "left",
    ).drop("__pgpoll_rk", "__pgpoll_rl", "__pgpoll_rs", "__pgpoll_rb")
    for i, (n, flag) in enumerate(known.items()):
        fill = ~F.col(flag) & F.col("__pgpoll_rv").isNotNull() & F.col("__pgpoll_alive")
        facts = (
            facts.withColumn(n, F.when(fill, F.col("__pgpoll_rv")[f"v{i}"]).otherwise(F.col(quote(n))))
            .withColumn(f"{flag}_raw", F.when(fill, F.col("__pgpoll_rv")[f"r{i}"]).otherwise(F.col(f"{flag}_raw")))
            .withColumn(flag, F.col(flag) | fill)
        )
    return facts.drop("__pgpoll_rv")
