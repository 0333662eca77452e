"""Materialize on top of a snapshot, with snapshot and typed change files built by hand (no server).

The files follow the storage format of ``pgpoll snapshot`` (plan, chunk
manifests, ``complete.json``, chunk Parquet) and of ``ingest --typed-tables``
(typed change rows with ``_xid``, commit-log records with ``xid_min``/``xid_max``).
Each scenario is chosen so that ordering by LSN, or applying every change,
gives a different state than ordering by visibility in the chunk's snapshot.

Chunk snapshots used below: chunk 0 (``id <= 10``) ``100:110:105``, chunk 1
(``id > 10``) ``100:130:105,115``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.materialize.snapshot_input import SnapshotCatalog
from pgpoll.materialize.snapshot_merge import added_columns_warning
from pgpoll.materialize.visibility import ChunkRange, SnapshotFilter
from pgpoll.sink import layout
from pgpoll.sink.commit.log import CommitRecord, record_name
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.stores.local import open_local
from pgpoll.typed.mapping import PgType
from pgpoll.typed.rows import ColumnLedger, TypedLayout
from pgpoll.typed.schemas import ColumnSchema, TableSchema
from pgpoll.xids import Snapshot
from tests.materialize.conftest import materialize, state_rows

INT, TEXT = PgType("int4", "integer"), PgType("text", "text")
S0, S1 = Snapshot(100, 110, (105,)), Snapshot(100, 130, (105, 115))
TS = datetime(2026, 11, 23, tzinfo=UTC)

T = TableSchema("public", "t", (ColumnSchema("id", INT), ColumnSchema("v", TEXT), ColumnSchema("big", TEXT)), ("id",), "d")
TR = TableSchema("public", "tr", (ColumnSchema("id", INT), ColumnSchema("v", TEXT)), ("id",), "d")
K = TableSchema("public", "k", (ColumnSchema("a", INT), ColumnSchema("b", TEXT)), ("a", "b"), "f")
U = TableSchema("public", "u", (ColumnSchema("id", INT), ColumnSchema("v", TEXT)), ("id",), "d")


class Output:
    """An output path written by hand: schemas, ledgers, typed batches, commit records, snapshots."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seq = 0
        self.layouts: dict[str, TypedLayout] = {}
        for s in (T, TR, K, U):
            ledger = ColumnLedger()
            self.layouts[s.qualified_name] = TypedLayout.build([s], ledger)
            self._write(f"{layout.SCHEMAS}/{s.schema_id}.json", s.to_json())
            self._write(f"{layout.LEDGERS}/{self.dir(s)}.json", json.dumps(ledger.to_json()))

    @staticmethod
    def dir(s: TableSchema) -> str:
        return layout.table_dir_name(s.schema, s.table)

    def _write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def batch(self, start: int, end: int, changes: dict[TableSchema, list[dict[str, Any]]], *, xids: bool = True,
              write: bool = True) -> None:
        """One committed batch; each change: op, lsn, seq, xid, row (new row / old row for D), before, toast."""
        partition = layout.partition_name(start, end)
        all_xids = [c["xid"] for cs in changes.values() for c in cs]
        for s, rows in changes.items():
            schema = self.layouts[s.qualified_name].arrow_schema()
            if "_xid" in schema.names and not xids:
                schema = schema.remove(schema.get_field_index("_xid"))  # written before ingest kept full xids
            elif "_xid" not in schema.names and xids:
                schema = schema.append(pa.field("_xid", pa.int64()))
            out = [{**c.get("row", {}), "_op": c["op"], "_commit_lsn": c["lsn"], "_seq": c.get("seq", 0), "_commit_ts": TS,
                    "_unchanged_toast": c.get("toast"), "_before": c.get("before"), "_schema_id": s.schema_id,
                    **({"_xid": c["xid"]} if xids else {})} for c in rows]
            target = self.root / layout.TABLES / self.dir(s) / partition
            if write:
                target.mkdir(parents=True)
                pq.write_table(pa.Table.from_pylist(out, schema=schema), target / "part-00000.parquet")
        self.seq += 1
        record = CommitRecord(
            start=f"0/{start:X}", end=f"0/{end:X}", rows=len(all_xids), files=[], partition=partition, slot="s",
            plugin="pgoutput", tables=sorted(self.dir(s) for s in changes), seq=self.seq,
            xid_min=min(all_xids) if xids else None, xid_max=max(all_xids) if xids else None,
        )
        self._write(f"{layout.COMMITS}/{record_name(self.seq)}", record.to_json())

    def snapshot(self, sid: str, plan_lsn: int, convergence: int,
                 tables: list[tuple[TableSchema, str, list[tuple[Any, Any, Snapshot, list[dict[str, Any]]]]]]) -> None:
        """A complete snapshot: per table its mode and chunks ``(lo, hi, snapshot, rows)``."""
        plan_tables = []
        for s, mode, chunks in tables:
            d = self.dir(s)
            typed = self.layouts[s.qualified_name]
            plan_tables.append({
                "schema": s.schema, "table": s.table, "dir": d, "mode": mode,
                "key": [] if mode == "shared" else list(s.key), "identity": s.identity,
                "key_kinds": [] if mode == "shared" else ["int4"] * len(s.key),
                "columns": [{"name": n, "physical": p, "type": t.to_json()} for p, n, t in typed.columns],
                "schema_id": s.schema_id, "relfilenode": 1, "row_filter": None, "column_list": None,
                "chunks": [{"n": n, "lo": lo, "hi": hi} for n, (lo, hi, _s, _r) in enumerate(chunks)],
            })
            own = pa.schema([pa.field(p, typed.arrow_schema().field(p).type) for p, _n, _t in typed.columns])
            schema = pa.schema([*own, pa.field("_untyped", pa.map_(pa.string(), pa.string())),
                                pa.field("_schema_id", pa.string())])
            for n, (_lo, _hi, snap, rows) in enumerate(chunks):
                data = self.root / "snapshots" / sid / d / f"chunk={n}"
                data.mkdir(parents=True)
                pq.write_table(pa.Table.from_pylist([{**r, "_schema_id": s.schema_id} for r in rows], schema=schema),
                               data / "part-00000.parquet")
                self._write(f"_pgpoll/snapshots/{sid}/{d}/chunk-{n:06d}.json", json.dumps({
                    "n": n, "snapshot": snap.to_json(), "relfilenode": 1, "rows": len(rows), "bytes": 1,
                    "files": [f"chunk={n}/part-00000.parquet"], "attempt": "a", "read_at": "x"}))
        self._write(f"_pgpoll/snapshots/{sid}/plan.json", json.dumps({
            "format": 1, "snapshot_id": sid, "slot": "s", "plugin": "pgoutput", "publications": [], "args": {},
            "created_at": "x", "plan_lsn": f"0/{plan_lsn:X}", "plan_lsn_int": plan_lsn, "tables": plan_tables}))
        self._write(f"_pgpoll/snapshots/{sid}/complete.json", json.dumps({
            "snapshot_id": sid, "completed_at": "x", "convergence_lsn": f"0/{convergence:X}",
            "convergence_lsn_int": convergence, "rows": 0, "chunks": 0, "tables": [s.qualified_name for s, _m, _c in tables]}))


def _u(lsn: int, xid: int, row: dict[str, Any], before: dict[str, Any] | None = None, toast: list[str] | None = None,
       op: str = "U") -> dict[str, Any]:
    return {"op": op, "lsn": lsn, "xid": xid, "row": row, "before": before, "toast": toast}


def _state(spark: Any, out: Path, table: str, *cols: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in cols) for r in state_rows(spark, str(out), "public", table))


def test_filter_rules_without_spark() -> None:
    rule = SnapshotFilter((ChunkRange(None, (10,), S0), ChunkRange((10,), None, S1)), ("id",), ("int",))
    # a TRUNCATE (xid 112) is invisible to chunk 0 only; one in chunk 1's xip (115) to both
    assert rule.cutoffs([(1500, 0, 112)]) == [(1500, 0), None]
    assert rule.cutoffs([(1500, 0, 112), (1600, 2, 115)]) == [(1600, 2), (1600, 2)]
    assert rule.all_visible(99) and not rule.all_visible(100)
    assert not rule.shared and SnapshotFilter((ChunkRange(None, None, S0),)).shared
    # ADD COLUMN ... DEFAULT writes no row change: only a snapshot can fill the older rows
    wider = TableSchema("public", "tr", (*TR.columns, ColumnSchema("d", TEXT)), ("id",), "d")
    found = added_columns_warning(TR, wider, "public.tr")
    assert found is not None and "column(s) d" in found and "`pgpoll snapshot --tables public.tr`" in found
    assert added_columns_warning(wider, wider, "public.tr") is None and added_columns_warning(None, wider, "x") is None


def test_the_latest_complete_snapshot_is_read_with_typed_bounds(tmp_path: Path) -> None:
    o = Output(tmp_path)
    o.snapshot("20261123T100000Z-aaaa", 1000, 1900, [
        (T, "chunked", [(None, [10], S0, []), ([10], None, S1, [])]), (K, "shared", [(None, None, S0, [])])])
    o.snapshot("20261123T110000Z-bbbb", 2000, 2100, [(T, "chunked", [(None, None, S1, [])])])
    (tmp_path / "_pgpoll/snapshots/20261123T110000Z-bbbb/complete.json").unlink()  # not complete: not used
    catalog = SnapshotCatalog(open_local(str(tmp_path)))
    t, k = catalog.latest("public", "t"), catalog.latest("public", "k")
    assert t is not None and k is not None and catalog.latest("public", "u") is None
    assert (t.snapshot_id, t.plan_lsn, t.convergence_lsn, t.min_xmin) == ("20261123T100000Z-aaaa", 1000, 1900, 100)
    assert [(c.lo, c.hi, c.snapshot) for c in t.chunks] == [(None, (10,), S0), ((10,), None, S1)]
    assert t.files[0].endswith("snapshots/20261123T100000Z-aaaa/public.t/chunk=0/part-00000.parquet")
    # the shape has the typed tables' schema id (under FULL every column is key)
    assert (t.shape.schema_id, k.shape.schema_id, k.mode, k.key) == (T.schema_id, K.schema_id, "shared", ())
    assert catalog.table_dirs() == {"public.t", "public.k"}


def test_chunk_placement_compares_composite_keys_as_rows(spark: Any) -> None:
    """``lo < (a, b) <= hi`` as PostgreSQL's row comparison, bytea compared as unsigned bytes."""
    from pyspark.sql import functions as F

    rule = SnapshotFilter((ChunkRange(None, (1, b"\x00\xff"), S0), ChunkRange((1, b"\x00\xff"), (2, b"\x01"), S0),
                           ChunkRange((2, b"\x01"), None, S1)), ("a", "b"), ("int", "binary"))
    keys = [(0, b"\xff"), (1, b"\x00\x10"), (1, b"\x00\xff"), (1, b"\x01"), (2, b"\x01"), (2, b"\x80"), (3, b"")]
    frame = spark.createDataFrame([(a, bytearray(b)) for a, b in keys], "a int, b binary")
    placed = frame.select("a", "b", rule.chunk_of(F.col).alias("c")).collect()
    expected = [0, 0, 0, 1, 1, 2, 2]
    assert [(r["a"], bytes(r["b"]), r["c"]) for r in placed] == [(a, b, c) for (a, b), c in zip(keys, expected, strict=True)]


def test_state_on_a_snapshot_applies_exactly_the_invisible_changes(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    o = Output(out)
    # an old batch (no full xids) before the snapshot began: taken as visible, never read as a change
    o.batch(400, 500, {T: [_u(450, 0, {"id": 2, "v": "WRONG"})]}, xids=False)
    # a batch every chunk sees (xid_max below every xmin): skipped without reading (its files do not even exist)
    o.batch(600, 700, {T: [_u(650, 90, {"id": 11, "v": "SKIPPED"})]}, write=False)
    o.batch(600, 1900, {
        T: [
            _u(600, 99, {"id": 2, "v": "b-old"}),  # visible to chunk 0: its row already holds what came after
            _u(1000, 112, {"id": 11, "v": "k-old"}),  # visible to chunk 1 (not in its xip), invisible to chunk 0
            # the race: committed (LSN 900) before the plan (1000) but in chunk 0's xip: must be applied;
            # big not sent (unchanged TOAST) -> filled from the chunk row
            _u(900, 105, {"id": 1, "v": "a-new"}, toast=["big"]),
            _u(1100, 115, {"id": 12, "v": "l", "big": "B12"}, op="I"),  # in chunk 1's xip
            # row 5 moves to 15: invisible to chunk 0 (5 goes), visible to chunk 1 (which holds 15 already)
            _u(1200, 112, {"id": 15, "v": "e"}, before={"id": 5}, toast=["big"]),
            _u(1800, 135, {"id": 15, "v": "e2"}, toast=["big"]),  # invisible to both; big from chunk 1's row
        ],
        TR: [
            _u(800, 103, {"id": 1, "v": "x"}, op="I"),  # visible everywhere
            {"op": "T", "lsn": 1500, "xid": 112},  # invisible to chunk 0 (empties it), visible to chunk 1
            _u(1550, 115, {"id": 21, "v": "late"}, op="I"),  # chunk 1's xip: applied
            _u(1600, 113, {"id": 2, "v": "after"}, op="I"),  # chunk 0: applied; (20 below: chunk 1 saw it)
            _u(1600, 113, {"id": 20, "v": "after20"}, op="I"),
        ],
        K: [
            _u(700, 104, {"a": 9, "b": "v"}, op="I"),  # visible: already in the rows
            _u(900, 105, {"a": 1, "b": "x"}, op="I"),  # invisible: a third (1, x)
            _u(1300, 120, {"a": 2, "b": "z"}, before={"a": 2, "b": "y"}),
        ],
        U: [_u(1000, 111, {"id": 7, "v": "u"})],  # no snapshot, and an UPDATE of a row the log never inserted
    })
    sid = "20261123T100000Z-aaaa"
    o.snapshot(sid, 1000, 1900, [
        (T, "chunked", [
            (None, [10], S0, [{"id": 1, "v": "a", "big": "B1"}, {"id": 2, "v": "b", "big": "B2"},
                              {"id": 5, "v": "e", "big": "B5"}]),
            ([10], None, S1, [{"id": 11, "v": "k", "big": "B11"}, {"id": 15, "v": "e", "big": "B5"}]),
        ]),
        (TR, "chunked", [
            (None, [10], S0, [{"id": 1, "v": "x"}, {"id": 3, "v": "y"}]),
            ([10], None, S1, [{"id": 20, "v": "after20"}]),
        ]),
        (K, "shared", [(None, None, S0, [{"a": 1, "b": "x"}, {"a": 1, "b": "x"}, {"a": 2, "b": "y"}, {"a": 9, "b": "v"}])]),
    ])
    assert SnapshotCatalog(open_local(str(out))).latest("public", "t") is not None

    code, tables, err = materialize(str(out))
    assert code == 0, err
    by = {t["table"]: t for t in tables}
    assert by["public.t"]["snapshot"] == {"id": sid, "complete": True, "converged": True}
    assert by["public.u"]["snapshot"] is None and "pgpoll snapshot --tables public.u" in by["public.u"]["warnings"][0]
    assert all(t["mode"] == "full" and not t["warnings"] for t in tables if t["table"] != "public.u"), tables
    assert _state(spark, out, "t", "id", "v", "big") == [
        (1, "a-new", "B1"), (2, "b", "B2"), (11, "k", "B11"), (12, "l", "B12"), (15, "e2", "B5")]
    assert _state(spark, out, "tr", "id", "v") == [(2, "after"), (20, "after20"), (21, "late")]
    assert _state(spark, out, "k", "a", "b") == [(1, "x"), (1, "x"), (1, "x"), (2, "z"), (9, "v")]

    # incremental: new changes filtered the same way (xid 104 is visible to chunk 0: not applied)
    o.batch(2000, 2500, {T: [_u(2100, 140, {"id": 11, "v": "k2"}), {"op": "D", "lsn": 2200, "xid": 104, "row": {"id": 2}}]})
    code, tables, err = materialize(str(out), "--tables", "public.t")
    assert code == 0 and tables[0]["mode"] == "incremental" and tables[0]["snapshot"]["id"] == sid, err
    assert _state(spark, out, "t", "id", "v") == [(1, "a-new"), (2, "b"), (11, "k2"), (12, "l"), (15, "e2")]

    # a re-snapshot of t replaces the earlier one: keys absent from it and not re-created vanish
    o.batch(2600, 2700, {T: [_u(2650, 215, {"id": 30, "v": "n30", "big": "B30"}, op="I"),
                             _u(2660, 205, {"id": 31, "v": "seen"}, op="I")]})  # 205 is visible: 31 is not in the rows
    sid2 = "20261123T120000Z-bbbb"
    o.snapshot(sid2, 2600, 5000, [(T, "chunked", [(None, None, Snapshot(200, 210), [{"id": 1, "v": "A", "big": "B1"}])])])
    code, tables, err = materialize(str(out))
    assert code == 0, err
    by = {t["table"]: t for t in tables}
    assert by["public.t"]["mode"] == "full" and by["public.t"]["snapshot"] == {"id": sid2, "complete": True, "converged": False}
    assert by["public.tr"]["snapshot"]["id"] == sid and by["public.tr"]["mode"] == "unchanged"
    assert _state(spark, out, "t", "id", "v", "big") == [(1, "A", "B1"), (30, "n30", "B30")]

    # Delta gives the same state and the same snapshot fields
    code, tables, err = materialize(str(out), "--format", "delta", "--to", str(tmp_path / "delta"), "--tables", "public.t")
    assert code == 0 and tables[0]["snapshot"]["id"] == sid2, err
    delta = read_delta(str(tmp_path / "delta" / "public.t")).select(["id", "v"]).to_pylist()
    assert sorted((r["id"], r["v"]) for r in delta) == [(1, "A"), (30, "n30")]

    # a batch without full xids after the snapshot began cannot be merged: exit 5 with the fix
    o.batch(2800, 2900, {T: [_u(2850, 0, {"id": 1, "v": "?"})]}, xids=False)
    code, tables, err = materialize(str(out), "--tables", "public.t")
    assert code == 5 and "run `pgpoll snapshot` again" in err, err
