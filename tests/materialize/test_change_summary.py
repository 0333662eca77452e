"""One aggregation over a table's changes answers what the separate per-question Spark jobs answered."""

from __future__ import annotations

from typing import Any

from pgpoll.materialize.change_summary import ChangeSummary, ShapeSpan, identity_segments, latest_schema, summarize
from pgpoll.sink.typed_tables import SchemaStore
from pgpoll.typed.mapping import PgType
from pgpoll.typed.schemas import IDENTITY_DEFAULT, IDENTITY_FULL, ColumnSchema, TableSchema

DDL = "_schema_id string, _op string, _commit_lsn bigint, _seq int, _unchanged_toast array<string>"
ROWS = [
    ("s1", "I", 100, 0, None), ("s1", "U", 100, 1, ["big"]), ("s1", "U", 100, 2, ["big", "doc"]),
    (None, "T", 200, 0, None),  # a TRUNCATE's row names no shape
    ("s2", "I", 300, 0, []), ("s2", "U", 300, 1, ["doc"]), ("s2", "D", 300, 2, None),
    ("s1", "U", 250, 5, ["big", "doc", "x"]), ("s3", "T", 150, 0, None),
]


def test_summarize_answers_like_the_separate_queries(spark: Any) -> None:
    from pyspark.sql import functions as F

    events = spark.createDataFrame(ROWS, DDL)
    got = summarize(events)
    pos = F.struct("_commit_lsn", "_seq")
    # the queries the run asked one by one before (newest and first position per shape, last TRUNCATE, TOAST columns)
    last = {r[0]: tuple(r[1]) for r in events.where(F.col("_schema_id").isNotNull()).groupBy("_schema_id")
            .agg(F.max(pos)).collect()}
    first = {r[0]: tuple(r[1]) for r in events.where(F.col("_schema_id").isNotNull()).groupBy("_schema_id")
             .agg(F.min(pos)).collect()}
    truncate = tuple(events.where(F.col("_op") == "T").agg(F.max(pos)).first()[0])
    lsn, seq = truncate
    after = events.where((F.col("_commit_lsn") > lsn) | ((F.col("_commit_lsn") == lsn) & (F.col("_seq") > seq)))
    toasted = {r[0] for r in after.where(F.col("_op").isin("I", "U", "D")).select(F.explode("_unchanged_toast"))
               .distinct().collect()}
    assert {s.schema_id: s.last for s in got.shapes} == last == {"s1": (250, 5), "s2": (300, 2), "s3": (150, 0)}
    assert {s.schema_id: s.first for s in got.shapes} == first
    assert got.last_truncate == truncate == (200, 0)
    assert got.toasted_after(got.last_truncate) == toasted == {"big", "doc", "x"}
    assert got.toasted_after(None) == {"big", "doc", "x"}
    assert got.toasted_after((260, 0)) == {"doc"}
    assert got.row_changes == 6  # INSERTs and UPDATEs, each once however many columns it left unchanged
    assert got.touches == 5  # UPDATEs and DELETEs


def _shape(sid: str, identity: str, key: tuple[str, ...] = ("id",), partial: bool = False) -> TableSchema:
    return TableSchema("public", "t", (ColumnSchema("id", PgType("int4", "integer")),), key, identity, partial, sid)


class _Store(SchemaStore):
    def __init__(self, *shapes: TableSchema) -> None:
        self.shapes = {s.schema_id: s for s in shapes}

    def load(self, sid: str) -> TableSchema:
        return self.shapes[sid]


def test_latest_schema_is_the_newest_full_shape_then_the_fallback_then_a_partial_one() -> None:
    keyed, full, partial = _shape("k", IDENTITY_DEFAULT), _shape("f", IDENTITY_FULL, ("id",)), _shape("p", "", (), True)
    store = _Store(keyed, full, partial)
    spans = (ShapeSpan("k", (10, 0), (20, 3)), ShapeSpan("f", (30, 0), (40, 1)), ShapeSpan("p", (50, 0), (50, 0)))
    assert latest_schema(ChangeSummary(spans), store, None) == full  # the partial one is newer but not full
    assert latest_schema(ChangeSummary(spans), store, None, ((45, -1), keyed)) == keyed  # a newer snapshot shape
    assert latest_schema(ChangeSummary(spans[2:]), store, "k") == keyed  # only partial: the previous state's
    assert latest_schema(ChangeSummary(spans[2:]), store, None) == partial
    assert latest_schema(None, store, None) is None
    assert latest_schema(ChangeSummary(), store, "f") == full


def test_identity_segments_start_where_matching_by_key_and_as_a_multiset_alternate() -> None:
    keyed, keyed2 = _shape("k", IDENTITY_DEFAULT), _shape("k2", IDENTITY_DEFAULT)
    full, partial = _shape("f", IDENTITY_FULL), _shape("p", "", (), True)
    store = _Store(keyed, keyed2, full, partial)
    spans = (ShapeSpan("f", (30, 0), (40, 1)), ShapeSpan("k", (10, 0), (20, 3)), ShapeSpan("p", (25, 0), (25, 0)),
             ShapeSpan("k2", (15, 0), (16, 0)))
    assert identity_segments(ChangeSummary(spans), store) == [((10, 0), keyed), ((30, 0), full)]
    assert identity_segments(ChangeSummary(spans[1:]), store) == [((10, 0), keyed)]
