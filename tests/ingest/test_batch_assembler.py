"""The ingest task's batch assembler: same records as the reference assembler, spilling, filtering."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from pgpoll.changes import UNCHANGED_TOAST, Begin, Column, Commit, LogicalMessage, Op, RowChange, Truncate
from pgpoll.decode.assembler import TransactionAssembler
from pgpoll.decode.decoders import make_decoder
from pgpoll.ingest.batch_assembler import HEARTBEAT_PREFIX, BatchAssembler
from tests.decode.test_pgoutput_fuzz import delete, insert, relation, update

TS = datetime(2026, 11, 22, 1, 2, 3, 456789, tzinfo=UTC)
COLS = (Column("id", "integer"), Column("v", "text"))


def _row(i: int, table: str = "t", op: Op = Op.INSERT) -> RowChange:
    after = {"id": str(i), "v": None if i % 3 == 0 else f"v{i}"}
    before = {"id": str(i)} if op is not Op.INSERT else None
    return RowChange(op, "public", table, COLS, before, None if op is Op.DELETE else after, lsn=1000 + i)


def _txn(xid: int, rows: Iterable[Any], commit_lsn: int) -> list[Any]:
    return [Begin(xid=xid, lsn=commit_lsn - 500), *rows, Commit(xid=xid, lsn=commit_lsn, commit_ts=TS)]


def _run(events: list[Any], **kwargs: Any) -> tuple[list[dict[str, Any]], BatchAssembler]:
    asm = BatchAssembler(high_water_mark=kwargs.pop("hwm", None), accepts=kwargs.pop("accepts", lambda s, t: True), **kwargs)
    batches: list[pa.RecordBatch] = []
    for event in events:
        lsn = getattr(event, "lsn", None) or 0
        if isinstance(event, Begin):
            asm.begin(event.xid, event.commit_ts)
            continue
        if isinstance(event, Commit):
            batches += asm.commit(event.lsn, event.xid, event.commit_ts)
        elif isinstance(event, RowChange):
            batches += asm.row_change(event, lsn)
        elif isinstance(event, Truncate):
            batches += asm.truncate(event, lsn)
        elif isinstance(event, LogicalMessage):
            batches += asm.message(event, lsn)
    batches += asm.finish()
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return sorted(rows, key=lambda r: (r["commit_lsn"], r["seq"])), asm


def _reference(events: list[Any]) -> list[dict[str, Any]]:
    asm = TransactionAssembler()
    out = []
    for record in (r for e in events for r in asm.feed(e)):
        if record.op is Op.MESSAGE and record.message_prefix == HEARTBEAT_PREFIX:
            continue
        out.append((record.commit_lsn, record.seq, record.op.value, record.table_name,
                    record.before, record.after, record.message_content))
    return out


def _key(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["commit_lsn"], r["seq"], r["op"], r["table_name"],
             dict(r["before"]) if r["before"] is not None else None,
             dict(r["after"]) if r["after"] is not None else None, r["message_content"]) for r in rows]


@pytest.mark.parametrize("rows_per_batch", [1, 3, 7, 1000])
def test_records_equal_the_reference_assembler_whatever_the_batch_size(rows_per_batch: int) -> None:
    events = (
        [
            *_txn(10, [_row(i) for i in range(20)], 5000),
            LogicalMessage(False, "pfx", b"alone", lsn=5100),
            *_txn(11, [_row(1, op=Op.UPDATE), _row(2, op=Op.DELETE),
                       Truncate((("public", "a"), ("public", "b")), lsn=5150),
                       LogicalMessage(True, "m", b"in txn", lsn=5160)], 5200),
            *_txn(12, [_row(i) for i in range(30, 45)], 6000),
        ]
    )
    rows, asm = _run(events, rows_per_batch=rows_per_batch)
    assert _key(rows) == _reference(events)
    assert asm.changes == len(rows) == 20 + 1 + 5 + 15
    assert asm.advance_to == 6000 and asm.first_commit_lsn == 5000 and asm.last_commit_lsn == 6000
    assert {r["commit_ts"] for r in rows if r["xid"] is not None} == {TS}
    assert all(r["xid"] is None and r["commit_ts"] is None for r in rows if r["commit_lsn"] == 5100)


def test_a_transaction_larger_than_a_batch_is_spilled_and_comes_back_whole() -> None:
    events = _txn(7, [_row(i) for i in range(250)], 9000)
    rows, asm = _run(events, rows_per_batch=16)
    assert [r["seq"] for r in rows] == list(range(250))
    assert {r["commit_lsn"] for r in rows} == {9000} and {r["xid"] for r in rows} == {7}
    assert [r["after"][0][1] for r in rows] == [str(i) for i in range(250)]
    assert len(asm.cols) <= 16


def test_a_non_transactional_message_inside_a_spilled_transaction_keeps_both_intact() -> None:
    events = [Begin(xid=3, lsn=1), *[_row(i) for i in range(10)],
              LogicalMessage(False, "nt", b"x", lsn=1500), *[_row(i) for i in range(10, 20)],
              Commit(xid=3, lsn=2000, commit_ts=TS)]
    rows, asm = _run(events, rows_per_batch=4)
    txn = [r for r in rows if r["commit_lsn"] == 2000]
    assert [r["seq"] for r in txn] == list(range(20))
    assert [r["message_content"] for r in rows if r["commit_lsn"] == 1500] == [b"x"]
    assert (asm.first_commit_lsn, asm.last_commit_lsn) == (1500, 2000)  # the batch's range holds the message


def test_transactions_at_or_below_the_high_water_mark_are_dropped_but_still_advance() -> None:
    events = _txn(1, [_row(1)], 100) + _txn(2, [_row(2)], 200) + _txn(3, [_row(3)], 300)
    rows, asm = _run(events, hwm=200, rows_per_batch=1)
    assert [r["commit_lsn"] for r in rows] == [300]
    assert asm.advance_to == 300


def test_heartbeats_and_filtered_tables_write_nothing_but_move_the_advance_point() -> None:
    events = (_txn(1, [LogicalMessage(True, HEARTBEAT_PREFIX, b"{}", lsn=50)], 100)
              + _txn(2, [_row(1, table="skip")], 200))
    rows, asm = _run(events, accepts=lambda s, t: t != "skip")
    assert rows == [] and asm.changes == 0 and asm.advance_to == 200


def test_an_unfinished_transaction_at_the_end_of_a_peek_is_not_written() -> None:
    events = [*_txn(1, [_row(1)], 100), Begin(xid=2, lsn=150), _row(2)]
    rows, asm = _run(events, rows_per_batch=1)
    assert [r["commit_lsn"] for r in rows] == [100] and asm.advance_to == 100


def test_fast_path_rows_are_written_like_the_same_changes_as_events() -> None:
    cols = (("a", 23, 1), ("big", 25, 0), ("c", 23, 1))
    messages = [
        insert("1", UNCHANGED_TOAST, "3"),
        update(["1", UNCHANGED_TOAST, "3"], old=["1", None, "2"], kind=b"K"),
        update(["1", "y", "3"], old=["1", UNCHANGED_TOAST, None], kind=b"O"),
        update(["4", "z", "5"]),
        delete(["1", None, "2"], kind=b"K"),
        insert("9", "skipped", "9", relid=16386),
    ]
    outputs = []
    for fast in (True, False):
        decode = make_decoder("pgoutput", 1)
        decode(relation(cols=cols), None, None)
        decode(relation(relid=16386, name="skip", cols=cols), None, None)
        asm = BatchAssembler(high_water_mark=None, accepts=lambda s, t: t != "skip", type_names=decode.type_names)
        asm.begin(5, TS)
        batches: list[pa.RecordBatch] = []
        for lsn, data in enumerate(messages, start=100):
            row = decode.fast_row(data) if fast and decode.fast_row is not None else None
            if row is not None:
                batches += asm.row_fields(row, lsn)
            else:
                event = decode(data, lsn, None)
                assert isinstance(event, RowChange)
                batches += asm.row_change(event, lsn)
        batches += asm.commit(200, 5, TS)
        batches += asm.finish()
        table = pa.Table.from_batches(batches).drop_columns(["schema_id"])
        outputs.append(table.to_pylist())
    assert outputs[0] == outputs[1] and len(outputs[0]) == 5
    assert outputs[0][0]["unchanged_toast"] == ["big"] and dict(outputs[0][1]["before"]) == {"a": "1", "c": "2"}


# ---- full 64-bit transaction ids ------------------------------------------------------

EPOCH = 1 << 32
#: a reference just past a wraparound (epoch 8): 32-bit ids above 5 belong to epoch 7
REFERENCE = 8 * EPOCH + 5


@pytest.mark.parametrize("rows_per_batch", [2, 1000])
def test_committed_ids_are_widened_across_the_epoch_boundary_spilled_or_not(rows_per_batch: int) -> None:
    events = _txn(0xFFFFFFF0, [_row(i) for i in range(5)], 100) + _txn(3, [_row(9)], 200)
    asm = BatchAssembler(high_water_mark=None, accepts=lambda s, t: True, rows_per_batch=rows_per_batch)
    asm.set_xid_reference(REFERENCE)
    batches: list[pa.RecordBatch] = []
    for event in events:
        if isinstance(event, Begin):
            asm.begin(event.xid, event.commit_ts)
        elif isinstance(event, Commit):
            batches += asm.commit(event.lsn, event.xid, event.commit_ts)
        else:
            batches += asm.row_change(event, event.lsn)
    batches += asm.finish()
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["xid"] for r in rows] == [7 * EPOCH + 0xFFFFFFF0] * 5 + [8 * EPOCH + 3]
    assert (asm.xid_min, asm.xid_max) == (7 * EPOCH + 0xFFFFFFF0, 8 * EPOCH + 3)


def test_without_a_reference_ids_stay_as_given() -> None:
    rows, asm = _run(_txn(42, [_row(1)], 100))
    assert [r["xid"] for r in rows] == [42] and (asm.xid_min, asm.xid_max) == (42, 42)


def test_xid_range_covers_empty_transactions_past_the_high_water_mark_only() -> None:
    events = (_txn(10, [_row(1)], 100)
              + _txn(11, [LogicalMessage(True, HEARTBEAT_PREFIX, b"{}", lsn=250)], 300)  # heartbeat: no rows
              + [LogicalMessage(False, "nt", b"x", lsn=350)]  # no transaction, no id
              + _txn(12, [_row(2, table="skip")], 400)  # a filtered table: no rows
              + [Begin(xid=13, lsn=450), _row(3)])  # unfinished: not covered
    rows, asm = _run(events, hwm=100, accepts=lambda s, t: t != "skip")
    assert [r["xid"] for r in rows] == [None]  # only the non-transactional message is written
    assert (asm.xid_min, asm.xid_max) == (11, 12)
    heartbeat_only, asm = _run(_txn(20, [LogicalMessage(True, HEARTBEAT_PREFIX, b"{}", lsn=550)], 600))
    assert heartbeat_only == [] and (asm.xid_min, asm.xid_max) == (20, 20) and asm.advance_to == 600
    _rows, nothing = _run([LogicalMessage(False, HEARTBEAT_PREFIX, b"{}", lsn=700)])
    assert (nothing.xid_min, nothing.xid_max) == (None, None)


def test_an_id_just_above_the_reference_is_placed_after_it() -> None:
    # a commit flushed (so decoded) but still running when the reference was read: the nearest full id
    asm = BatchAssembler(high_water_mark=None, accepts=lambda s, t: True)
    asm.set_xid_reference(REFERENCE)
    assert asm.full_xid(9) == 8 * EPOCH + 9  # 4 above: not a whole epoch back
    assert asm.full_xid(0xFFFFFFFE) == 7 * EPOCH + 0xFFFFFFFE  # 7 below, across the boundary
    asm.set_xid_reference(0xFFFFFFFD)
    assert asm.full_xid(2) == EPOCH + 2  # 5 above, across the boundary


def test_an_id_the_reference_cannot_widen_is_a_source_error() -> None:
    from pgpoll.errors import SourceError

    asm = BatchAssembler(high_water_mark=None, accepts=lambda s, t: True)
    asm.set_xid_reference(100)  # epoch 0: an id more than 2^31 above has no full id within 2^31 of it
    asm.begin(0xFFFFFF00, TS)
    with pytest.raises(SourceError, match="cannot be widened"):
        list(asm.commit(1000, 0xFFFFFF00, TS))


def _pgoutput_frame(xid: int, body: list[bytes]) -> list[bytes]:
    import struct

    micros = 100
    begin = b"B" + struct.pack("!QqI", 0x3000, micros, xid)
    commit = b"C" + struct.pack("!BQQq", 0, 0x3000, 0x3100, micros)
    return [begin, *body, commit]


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_both_plugins_framing_and_fast_path_store_the_full_id(plugin: str) -> None:
    """The task's own loop (fast path first, events otherwise): pgoutput's Begin and test_decoding's BEGIN line."""
    from pgpoll.ingest.task import _dispatch

    xid = 0xFFFFFFF0
    decode = make_decoder(plugin, 1)
    if plugin == "pgoutput":
        data: list[Any] = [relation(), *_pgoutput_frame(xid, [insert("1", "a"), update(["1", "b"])])]
    else:
        data = [f"BEGIN {xid}", "table public.t: INSERT: id[integer]:1 v[text]:'a'",
                f"COMMIT {xid} (at 2026-11-22 01:02:03.456789+00)"]
    asm = BatchAssembler(high_water_mark=None, accepts=lambda s, t: True, type_names=decode.type_names)
    asm.set_xid_reference(REFERENCE)
    batches: list[pa.RecordBatch] = []
    for lsn, row in enumerate(data, start=0x3000):
        fields = decode.fast_row(row) if decode.fast_row is not None else None
        if fields is not None:
            batches += asm.row_fields(fields, lsn)
        else:
            batches += _dispatch(asm, decode(row, lsn, xid), lsn)
    batches += asm.finish()
    rows = pa.Table.from_batches(batches).to_pylist()
    assert rows and {r["xid"] for r in rows} == {7 * EPOCH + xid}
