"""The driver's replay gives the state the Spark engine gives, on the same typed changes.

Random histories of a simulated table (inserts, updates with and without
unchanged TOAST values, key changes, deletes, re-inserted keys, TRUNCATEs,
updates of rows older than the history, NaN and -0.0 values, identical rows
under REPLICA IDENTITY FULL), with and without a previous state, go through
:func:`pgpoll.materialize.driver.state.replay` and through
:func:`pgpoll.materialize.state.materialize` on real Spark; the rows, the
unresolved-TOAST counts and the schemas must be equal.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgpoll.materialize.driver.run import requested_engine, state_schema
from pgpoll.materialize.driver.state import decline, predates, replay, summarize_table
from pgpoll.materialize.state import StateColumn, materialize
from pgpoll.typed.mapping import type_from_name
from pgpoll.typed.rows import ColumnLedger, TypedLayout
from pgpoll.typed.schemas import IDENTITY_FULL, ColumnSchema, TableSchema

_TYPES = {"id": "integer", "v": "text", "big": "text", "n": "double precision"}


def _shape(full: bool) -> TableSchema:
    cols = tuple(ColumnSchema(n, type_from_name(t)) for n, t in _TYPES.items())
    return TableSchema("public", "t", cols, tuple(_TYPES) if full else ("id",), IDENTITY_FULL if full else "d")


def _history(seed: int, full: bool, rows: int = 160) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """Typed change rows as ingest writes them, and the rows that existed before the history (keyed tables)."""
    r = random.Random(seed)
    table: dict[int, dict[str, Any]] = {}
    older = {i: {"id": i, "v": f"old{i}", "big": "B" * 20 + str(i), "n": 1.0} for i in range(1000, 1005)}
    out: list[dict[str, Any]] = []
    lsn = 100
    next_id = 1
    for _ in range(rows // 4):  # transactions of up to four changes
        lsn += 10
        for seq in range(r.randint(1, 4)):
            roll = r.random()
            base = {"_commit_lsn": lsn, "_seq": seq, "_commit_ts": 1_700_000_000_000_000 + lsn, "_xid": lsn,
                    "_unchanged_toast": [], "_before": None, "_untyped": None}
            alive = list(table)
            if roll < 0.02:
                table.clear()
                out.append({**base, "_op": "T", "id": None, "v": None, "big": None, "n": None})
                continue
            if full and roll < 0.1 and alive:  # an identical row (no key: both are kept)
                out.append({**base, "_op": "I", **table[r.choice(alive)]})
                continue
            if roll < 0.35 or not alive:
                free = [k for k in range(1, next_id) if k not in table] or [next_id]  # a key used before
                i = next_id if r.random() < 0.9 or not alive else r.choice(free)
                next_id = max(next_id, i + 1)
                row = {"id": i, "v": r.choice(["a", "b", None]), "big": r.choice(["X" * 30, "Y" * 30, None]),
                       "n": r.choice([1.5, -0.0, 0.0, float("nan"), None])}
                table[i] = row
                out.append({**base, "_op": "I", **row})
                continue
            if roll < 0.42 and not full:  # a row older than the history: its unchanged TOAST value is unknown
                i = r.choice(list(older))
                row = dict(older[i], v="upd")
                out.append({**base, "_op": "U", **dict(row, big=None), "_unchanged_toast": ["big"]})
                continue
            i = r.choice(alive)
            old = table[i]
            if roll < 0.8:
                new = dict(old, v=r.choice(["u1", "u2", None]), n=r.choice([2.5, float("nan"), old["n"]]))
                moved = not full and r.random() < 0.3
                if moved:
                    new["id"] = next_id
                    next_id += 1
                toast = r.random() < 0.5
                change = {**base, "_op": "U", **new}
                if toast:
                    change["big"] = None
                    change["_unchanged_toast"] = ["big"]
                if full:
                    change["_before"] = dict(old)
                elif moved:
                    change["_before"] = {"id": old["id"], "v": None, "big": None, "n": None}
                del table[i]
                table[new["id"]] = new
                out.append(change)
            else:
                del table[i]
                gone = dict(old) if full else {"id": old["id"], "v": None, "big": None, "n": None}
                out.append({**base, "_op": "D", **gone})
    if not full:  # and last (after any TRUNCATE), one more update of a row older than the history
        lsn += 10
        out.append({"_op": "U", "_commit_lsn": lsn, "_seq": 0, "_commit_ts": 1_700_000_000_000_000 + lsn, "_xid": lsn,
                    "_unchanged_toast": ["big"], "_before": None, "_untyped": None, **dict(older[1001], big=None)})
    return out, table


def _events(changes: list[dict[str, Any]], shape: TableSchema, path: Path) -> pa.Table:
    typed = TypedLayout.build([shape], ColumnLedger())
    schema = typed.arrow_schema()
    rows = [dict(c, _schema_id=None if c["_op"] == "T" else shape.schema_id) for c in changes]
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path)
    return table


def _columns(shape: TableSchema) -> list[StateColumn]:
    return [StateColumn(c.name, c.type, (c.name,)) for c in shape.columns]


def _canonical(rows: list[dict[str, Any]]) -> list[str]:
    def value(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if isinstance(v, list):  # a map read back from Arrow: its entries, in any order
            return sorted(map(list, v))
        if isinstance(v, dict):
            return sorted(v.items())
        return v
    return sorted(json.dumps({k: value(v) for k, v in r.items()}, sort_keys=True, default=str) for r in rows)


def _spark_state(spark: Any, events: Path | None, previous: Path | None, columns: list[StateColumn],
                 key: list[str], out: Path) -> tuple[pa.Table, int]:
    from pgpoll.spark.session import configure_writes

    configure_writes(spark)  # (as run_materialize does: timestamps as TIMESTAMP(MICROS))
    ev = spark.read.parquet(str(events)) if events is not None else None
    prev = spark.read.parquet(str(previous)) if previous is not None else None
    result = materialize(ev, prev, columns, key)
    result.frame.write.parquet(str(out))
    return pq.read_table(out), result.unresolved_toast


@pytest.mark.parametrize("full", [False, True], ids=["keyed", "full identity"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_replay_equals_the_spark_engine_with_and_without_a_previous_state(
    spark: Any, tmp_path: Path, seed: int, full: bool,
) -> None:
    shape = _shape(full)
    columns = _columns(shape)
    key = [] if full else ["id"]
    schema = state_schema(columns)
    changes, _ = _history(seed, full)
    first, second = changes[: len(changes) // 2], changes[len(changes) // 2:]
    events_a = _events(first, shape, tmp_path / "a.parquet")
    events_b = _events(second, shape, tmp_path / "b.parquet")
    # one run over the first half, a second run on top of its state
    mine_a, unresolved_a = replay(events_a, None, columns, key, schema)
    theirs_a, spark_unresolved_a = _spark_state(spark, tmp_path / "a.parquet", None, columns, key, tmp_path / "sa")
    assert _canonical(mine_a.to_pylist()) == _canonical(theirs_a.to_pylist())
    assert unresolved_a == spark_unresolved_a
    assert mine_a.schema.equals(theirs_a.schema.remove_metadata()), (mine_a.schema, theirs_a.schema)
    pq.write_table(mine_a, tmp_path / "prev.parquet")
    mine_b, unresolved_b = replay(events_b, pq.read_table(tmp_path / "sa"), columns, key, schema)
    theirs_b, spark_unresolved_b = _spark_state(spark, tmp_path / "b.parquet", tmp_path / "sa", columns, key, tmp_path / "sb")
    assert _canonical(mine_b.to_pylist()) == _canonical(theirs_b.to_pylist())
    assert unresolved_b == spark_unresolved_b
    # the whole history at once gives the same state as the two runs
    whole, _ = replay(pa.concat_tables([events_a, events_b]), None, columns, key, schema)
    assert _canonical(whole.to_pylist()) == _canonical(mine_b.to_pylist())
    if not full:
        assert unresolved_a + unresolved_b > 0  # the histories do reach rows older than them


def test_the_replay_follows_the_source_rows_of_a_simulated_history(tmp_path: Path) -> None:
    shape = _shape(False)
    changes, table = _history(11, False, rows=400)
    events = _events(changes, shape, tmp_path / "e.parquet")
    got, unresolved = replay(events, None, _columns(shape), ["id"], state_schema(_columns(shape)))
    by_id = {r["id"]: r for r in got.to_pylist()}
    assert unresolved > 0
    for i, row in table.items():  # every row the simulated table holds, with its TOAST value carried over
        assert by_id[i]["v"] == row["v"] and by_id[i]["big"] == row["big"], i
    older = set(by_id) - set(table)
    assert older <= set(range(1000, 1005))  # and only rows updated from before the history besides


def test_the_summary_and_the_predates_check_answer_like_the_spark_queries(spark: Any, tmp_path: Path) -> None:
    from pgpoll.materialize.change_summary import summarize
    from pgpoll.materialize.snapshot_merge import predates_warning

    shape = _shape(False)
    changes, _ = _history(5, False)
    events = _events(changes, shape, tmp_path / "e.parquet")
    frame = spark.read.parquet(str(tmp_path / "e.parquet"))
    assert summarize_table(events) == summarize(frame)
    assert predates(events, {"id": "id"}) == (predates_warning(frame, {"id": "id"}, "public.t") is not None)
    inserts_only = _events([c for c in changes if c["_op"] == "I"], shape, tmp_path / "i.parquet")
    assert predates(events, {"id": "id"}) and not predates(inserts_only, {"id": "id"})


def test_values_of_an_older_type_and_a_previous_state_of_another_type_go_to_spark(tmp_path: Path) -> None:
    shape = _shape(False)
    changes, _ = _history(3, False, rows=20)
    events = _events(changes, shape, tmp_path / "e.parquet")
    retyped = [StateColumn("id", type_from_name("bigint"), ("id__int8", "id")), *_columns(shape)[1:]]
    assert decline(events, None, retyped, state_schema(retyped)) == "column id holds values of an older type"
    assert decline(events, None, _columns(shape), state_schema(_columns(shape))) is None
    previous = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["a"])})  # an int column that was a bigint
    assert "previous state's column id" in (decline(None, previous, _columns(shape), state_schema(_columns(shape))) or "")
    element = pa.list_(pa.field("element", pa.string()))
    spark_lists = pa.table({"id": pa.array([1], pa.int32()), "tags": pa.array([["a"]], element)})
    with_list = [*_columns(shape), StateColumn("tags", type_from_name("text[]"), ("tags",))]
    assert decline(None, spark_lists, with_list, state_schema(with_list)) is None  # list item names aside


def test_the_engine_setting_is_checked() -> None:
    from pgpoll.errors import ConfigError

    assert requested_engine({}) == "auto" and requested_engine({"PGPOLL_MATERIALIZE_ENGINE": " Spark "}) == "spark"
    with pytest.raises(ConfigError, match="PGPOLL_MATERIALIZE_ENGINE='fast' is not one of auto, spark, driver"):
        requested_engine({"PGPOLL_MATERIALIZE_ENGINE": "fast"})
