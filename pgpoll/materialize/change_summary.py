"""What a run asks of a table's changes before computing its state, answered by one Spark aggregation.

Before the state itself, a run needs a few small facts about the changes it
applies: the column descriptions (``_schema_id``) they were written under and
where each first and last appears (the newest shape names the state's
columns; where the replica identity changes, the changes are replayed in
stretches), the last TRUNCATE, and which columns some change left as an
unchanged TOAST value. Asked one by one, each is a Spark job over the same
changes, and on small tables those jobs, not the data, are the run's cost.
:func:`summarize` answers them all in one pass: the changes, with their
unchanged-TOAST column lists exploded (most are empty), grouped by
``(_schema_id, column)``; the few resulting rows come back to the driver and
:class:`ChangeSummary` derives each answer from them exactly as the separate
queries did.

The positions are ``(commit_lsn, seq)`` pairs and compare as Spark's structs
do (lexicographically).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgpoll.sink.typed_tables import SchemaStore
from pgpoll.typed.schemas import IDENTITY_FULL, TableSchema

Position = tuple[int, int]  # (commit_lsn, seq)


@dataclass(frozen=True)
class ShapeSpan:
    """Where the changes written under one column description first and last appear."""

    schema_id: str
    first: Position
    last: Position


@dataclass(frozen=True)
class ChangeSummary:
    """The answers of :func:`summarize` for one table's changes."""

    shapes: tuple[ShapeSpan, ...] = ()
    """Per ``_schema_id`` (changes without one, such as a TRUNCATE's row, aside)."""
    last_truncate: Position | None = None
    """The position of the last TRUNCATE."""
    toast_last: Mapping[str, Position] = field(default_factory=dict)
    """Per column, the last INSERT, UPDATE or DELETE that left it as an unchanged TOAST value."""
    row_changes: int = 0
    """INSERTs and UPDATEs: no keyed state built from these changes alone has more rows."""
    touches: int = 0
    """UPDATEs and DELETEs (none: no change can touch a row the changes did not create)."""

    def toasted_after(self, start: Position | None) -> set[str]:
        """The columns left unchanged by an INSERT, UPDATE or DELETE after ``start`` (None: any)."""
        return {c for c, last in self.toast_last.items() if start is None or last > start}


def summarize(events: Any) -> ChangeSummary:
    """One Spark aggregation over ``events`` (a table's typed changes); see the module docstring."""
    from pyspark.sql import functions as F

    position = F.struct("_commit_lsn", "_seq")
    op = F.col("_op")
    once = F.coalesce(F.col("__pgpoll_i") == 0, F.lit(True))
    rows = (
        events.select(
            "_schema_id", "_op", "_commit_lsn", "_seq",
            F.posexplode_outer(F.coalesce("_unchanged_toast", F.array().cast("array<string>"))).alias("__pgpoll_i", "__pgpoll_t"),
        )
        .groupBy("_schema_id", "__pgpoll_t")
        .agg(
            F.min(position).alias("lo"), F.max(position).alias("hi"),
            F.max(F.when(op == "T", position)).alias("truncate"),
            F.max(F.when(op.isin("I", "U", "D"), position)).alias("keyed"),
            # each change once: its first exploded column, or its only row when it left none unchanged
            F.count(F.when(op.isin("I", "U") & once, 1)).alias("n"), F.count(F.when(op.isin("U", "D") & once, 1)).alias("m"),
        )
        .collect()
    )
    spans: dict[str, tuple[Position, Position]] = {}
    toast: dict[str, Position] = {}
    truncates: list[Position] = []
    changes = touches = 0
    for r in rows:
        lo, hi = _position(r["lo"]), _position(r["hi"])
        sid, column = r["_schema_id"], r["__pgpoll_t"]
        if sid is not None and lo is not None and hi is not None:
            was = spans.get(sid)
            spans[sid] = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))
        truncate, keyed = _position(r["truncate"]), _position(r["keyed"])
        if truncate is not None:
            truncates.append(truncate)
        if column is not None and keyed is not None:
            toast[column] = max(toast.get(column, keyed), keyed)
        changes += int(r["n"] or 0)
        touches += int(r["m"] or 0)
    shapes = tuple(ShapeSpan(sid, lo, hi) for sid, (lo, hi) in sorted(spans.items()))
    return ChangeSummary(shapes, max(truncates, default=None), toast, changes, touches)


def _position(value: Any) -> Position | None:
    return None if value is None else (value[0], value[1])


def replay_key(shape: TableSchema) -> list[str]:
    """The key changes of this shape are matched by; empty (a multiset) under REPLICA IDENTITY FULL or without a key."""
    return [] if shape.identity == IDENTITY_FULL or not shape.key else list(shape.key)


def latest_schema(summary: ChangeSummary | None, store: SchemaStore, fallback: str | None,
                  floor: tuple[Position, TableSchema] | None = None) -> TableSchema | None:
    """The shape of the table's newest change (or ``floor``, a snapshot's shape at its position, when newer);
    a partial one (a test_decoding DELETE's old key) only when neither a full shape among the changes nor
    ``fallback`` (the previous state's) is known."""
    spans = summary.shapes if summary is not None else ()
    shapes = [(s.last, store.load(s.schema_id)) for s in spans] + ([floor] if floor else [])
    full = [s for s in shapes if not s[1].partial]
    if full:
        return max(full, key=lambda s: s[0])[1]
    if fallback is not None:
        return store.load(fallback)
    return max(shapes, key=lambda s: s[0])[1] if shapes else None


def identity_segments(summary: ChangeSummary, store: SchemaStore) -> list[tuple[Position, TableSchema]]:
    """Where in the changes the way rows are matched (key or multiset) changes: ``[(first position, shape)]``.

    pgoutput's Relation carries the identity a change was written under;
    test_decoding's shapes carry what the catalog said when the batch was
    ingested.
    """
    out: list[tuple[Position, TableSchema]] = []
    for lo, shape in sorted(((s.first, store.load(s.schema_id)) for s in summary.shapes), key=lambda x: x[0]):
        if shape.partial:
            continue
        if not out or (not replay_key(out[-1][1])) != (not replay_key(shape)):
            out.append((lo, shape))
    return out
