"""Tests for the transaction assembler and the JSON form of change records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pgpoll.changes import (
    Begin,
    BeginPrepare,
    ChangeRecord,
    Column,
    Commit,
    CommitPrepared,
    Event,
    Ignored,
    LogicalMessage,
    Op,
    Prepare,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from pgpoll.decode.assembler import TransactionAssembler, change_record_to_json
from pgpoll.decode.text_decoder import STREAM_CHANGE, TestDecodingDecoder
from pgpoll.errors import DecodeError

TS = datetime(2026, 11, 22, 1, 53, 54, 95995, tzinfo=UTC)
COLS = (Column("id", "integer"),)


def ins(i: int, lsn: int, xid: int | None = None, table: str = "t") -> RowChange:
    return RowChange(Op.INSERT, "public", table, COLS, None, {"id": str(i)}, xid=xid, lsn=lsn)


def run(events: list[Event], **kw: bool) -> list[ChangeRecord]:
    asm = TransactionAssembler(**kw)
    out: list[ChangeRecord] = []
    for ev in events:
        out.extend(asm.feed(ev))
    return out


def rec(commit_lsn: int | None, lsn: int | None, seq: int, xid: int | None, **kw: object) -> ChangeRecord:
    fields: dict[str, object] = {
        "commit_ts": None, "op": Op.INSERT, "schema_name": "public", "table_name": "t"
    }
    fields.update(kw)
    return ChangeRecord(commit_lsn, lsn, seq, xid, **fields)  # type: ignore[arg-type]


# ---- plain transactions -------------------------------------------------------------


def test_groups_a_transaction_and_numbers_seq_with_truncate_fan_out() -> None:
    asm = TransactionAssembler()
    assert asm.feed(Begin(xid=7, lsn=100)) == []
    assert asm.in_transaction
    assert asm.feed(ins(1, 110, 7)) == []
    upd = RowChange(Op.UPDATE, "public", "t", COLS, {"id": "1"}, {"id": "2"}, xid=7, lsn=120)
    asm.feed(upd)
    asm.feed(Truncate((("public", "a"), ("s", "b")), cascade=True, xid=7, lsn=130))
    asm.feed(LogicalMessage(True, "pfx", b"hi", xid=7, lsn=140))
    out = asm.feed(Commit(xid=7, lsn=200, end_lsn=200, commit_ts=TS))
    assert not asm.in_transaction
    assert out == [
        rec(200, 110, 0, 7, commit_ts=TS, after={"id": "1"}),
        rec(200, 120, 1, 7, commit_ts=TS, op=Op.UPDATE, before={"id": "1"}, after={"id": "2"}),
        rec(200, 130, 2, 7, commit_ts=TS, op=Op.TRUNCATE, table_name="a"),
        rec(200, 130, 3, 7, commit_ts=TS, op=Op.TRUNCATE, schema_name="s", table_name="b"),
        rec(
            200, 140, 4, 7, commit_ts=TS, op=Op.MESSAGE, schema_name=None, table_name=None,
            message_prefix="pfx", message_content=b"hi", transactional=True,
        ),
    ]


def test_commit_lsn_falls_back_to_end_lsn_and_xid_to_commit() -> None:
    out = run([Begin(xid=None), ins(1, 5), Commit(xid=9, end_lsn=300)])
    assert out == [rec(300, 5, 0, 9, after={"id": "1"})]


def test_seq_restarts_per_transaction_and_unchanged_toast_is_kept() -> None:
    toast = RowChange(Op.UPDATE, "public", "t", COLS, None, {"id": "1"}, ("big",), lsn=21)
    out = run([Begin(1), ins(1, 11), Commit(1, lsn=12), Begin(2), toast, Commit(2, lsn=22)])
    assert [(r.commit_lsn, r.seq, r.xid) for r in out] == [(12, 0, 1), (22, 0, 2)]
    assert out[1].unchanged_toast == ("big",)


def test_empty_transaction_emits_nothing() -> None:
    assert run([Begin(1, lsn=1), Commit(1, lsn=2)]) == []


def test_non_transactional_message_is_emitted_at_once() -> None:
    asm = TransactionAssembler()
    asm.feed(Begin(5, lsn=10))
    out = asm.feed(LogicalMessage(False, "hb", b"x", xid=5, lsn=15))
    assert out == [
        ChangeRecord(15, 15, 0, None, None, Op.MESSAGE, message_prefix="hb",
                     message_content=b"x", transactional=False)
    ]
    assert asm.feed(Commit(5, lsn=20)) == []


def test_changes_outside_transactions_get_null_transaction_fields() -> None:
    out = run(
        [
            ins(1, 5, xid=3),
            Truncate((("public", "a"), ("public", "b")), lsn=6),
            LogicalMessage(True, "p", b"", lsn=7),
        ]
    )
    assert out == [
        rec(None, 5, 0, None, after={"id": "1"}),
        rec(None, 6, 0, None, op=Op.TRUNCATE, table_name="a"),
        rec(None, 6, 1, None, op=Op.TRUNCATE, table_name="b"),
        rec(None, 7, 0, None, op=Op.MESSAGE, schema_name=None, table_name=None,
            message_prefix="p", message_content=b"", transactional=True),
    ]


def test_begin_timestamp_is_used_when_commit_has_none() -> None:
    out = run([Begin(4, lsn=1, commit_ts=TS), ins(1, 2), Commit(4, lsn=3)])
    assert out[0].commit_ts == TS


@pytest.mark.parametrize(
    "events",
    [
        [Commit(1, lsn=2)],
        [Begin(1), Begin(2)],
        [Begin(1), StreamStart(3)],
        [Prepare(1, "g")],
    ],
)
def test_broken_framing_raises_decode_error(events: list[Event]) -> None:
    with pytest.raises(DecodeError):
        run(events)


def test_ignored_events_are_skipped_and_finish_resets() -> None:
    asm = TransactionAssembler()
    asm.feed(Begin(1))
    asm.feed(Ignored("relation"))
    assert asm.in_transaction
    assert asm.finish() == []
    assert not asm.in_transaction
    assert asm.feed(Begin(2)) == []


# ---- streaming ------------------------------------------------------------------------


def test_stream_commit_emits_buffered_chunks_minus_aborted_subtransaction() -> None:
    asm = TransactionAssembler()
    events: list[Event] = [
        StreamStart(10, first_segment=True),
        ins(1, 101, xid=10),
        ins(2, 102, xid=11),
        StreamStop(),
        StreamStart(20, first_segment=True),
        ins(9, 150, xid=20),
        StreamStop(),
        StreamStart(10),
        ins(3, 103, xid=12),
        ins(4, 104, xid=11),
        StreamStop(),
        StreamAbort(10, 11),
    ]
    for ev in events:
        assert asm.feed(ev) == []
    assert not asm.in_transaction
    assert asm.open_streams == (10, 20)
    assert asm.hold_lsn is None  # the stream starts carried no lsn
    out = asm.feed(StreamCommit(10, lsn=500, commit_ts=TS))
    assert out == [
        rec(500, 101, 0, 10, commit_ts=TS, after={"id": "1"}),
        rec(500, 103, 1, 10, commit_ts=TS, after={"id": "3"}),
    ]
    assert asm.feed(StreamAbort(20, 20)) == []
    assert not asm.open_streams


def test_stream_abort_of_the_whole_transaction_drops_it() -> None:
    out = run([StreamStart(10), ins(1, 1, xid=10), StreamStop(), StreamAbort(10, 10), StreamCommit(10, lsn=9)])
    assert out == []


def test_stream_commit_falls_back_to_end_lsn() -> None:
    out = run([StreamStart(3), ins(1, 1, xid=3), StreamStop(), StreamCommit(3, end_lsn=77)])
    assert [(r.commit_lsn, r.xid) for r in out] == [(77, 3)]


def test_inside_a_stream_block_counts_as_in_transaction() -> None:
    asm = TransactionAssembler()
    asm.feed(StreamStart(3))
    assert asm.in_transaction
    asm.feed(StreamStop())
    assert not asm.in_transaction


def test_test_decoding_streamed_changes_cannot_be_committed() -> None:
    events: list[Event] = [
        StreamStart(10),
        Ignored(STREAM_CHANGE),
        StreamStop(),
        StreamCommit(10, lsn=5),
    ]
    with pytest.raises(DecodeError, match="did not print"):
        run(events)
    assert run(events, allow_opaque_streams=True) == []


def test_test_decoding_aborted_stream_with_opaque_changes_is_fine() -> None:
    events: list[Event] = [StreamStart(10), Ignored(STREAM_CHANGE), StreamStop(), StreamAbort(10, 10)]
    assert run(events) == []


def test_test_decoding_subtransaction_abort_does_not_drop_the_stream() -> None:
    asm = TransactionAssembler()
    for ev in (StreamStart(10), Ignored(STREAM_CHANGE), StreamStop(), StreamAbort(11, 11)):
        asm.feed(ev)
    assert asm.open_streams == (10,)


# ---- two-phase -----------------------------------------------------------------------


def test_prepared_transaction_is_kept_until_commit_prepared() -> None:
    asm = TransactionAssembler()
    for ev in (Begin(30, lsn=1), ins(1, 2, 30), Prepare(30, "g1", lsn=3)):
        assert asm.feed(ev) == []
    assert asm.pending_prepared == ("g1",)
    assert asm.hold_lsn == 1
    assert not asm.in_transaction
    assert asm.feed(Begin(31, lsn=4)) == []
    assert asm.feed(ins(2, 5, 31)) == []
    assert asm.feed(Commit(31, lsn=6)) == [rec(6, 5, 0, 31, after={"id": "2"})]
    out = asm.feed(CommitPrepared(30, "g1", lsn=9, commit_ts=TS))
    assert out == [rec(9, 2, 0, 30, commit_ts=TS, after={"id": "1"})]
    assert not asm.pending_prepared
    assert asm.hold_lsn is None


def test_rollback_prepared_drops_and_pgoutput_begin_prepare_works() -> None:
    events: list[Event] = [
        BeginPrepare(40, gid="g2", lsn=1),
        ins(1, 2, 40),
        Prepare(40, "g2", lsn=3),
        RollbackPrepared(40, "g2", lsn=4),
        CommitPrepared(40, "g2", lsn=5),
    ]
    asm = TransactionAssembler()
    assert [r for ev in events for r in asm.feed(ev)] == []
    assert asm.unmatched_commit_prepared == ("g2",)


def test_commit_prepared_without_its_prepare_emits_nothing() -> None:
    asm = TransactionAssembler()
    assert asm.feed(CommitPrepared(None, "old", lsn=5)) == []
    assert asm.unmatched_commit_prepared == ("old",)


def test_streamed_prepare_then_commit_prepared() -> None:
    events: list[Event] = [
        StreamStart(50),
        ins(1, 10, 50),
        StreamStop(),
        Prepare(50, "sg", lsn=20, streamed=True),
        CommitPrepared(50, "sg", lsn=30),
    ]
    assert run(events) == [rec(30, 10, 0, 50, after={"id": "1"})]


def test_streamed_prepare_without_xid_takes_the_only_open_stream() -> None:
    events: list[Event] = [
        StreamStart(0),
        ins(1, 10),
        StreamStop(),
        Prepare(None, "sg", streamed=True),
        CommitPrepared(None, "sg", lsn=30),
    ]
    assert [(r.commit_lsn, r.seq) for r in run(events)] == [(30, 0)]


# ---- with the test_decoding decoder ----------------------------------------------------


def test_test_decoding_lines_end_to_end() -> None:
    dec = TestDecodingDecoder()
    rows = [
        (0x100, 700, "BEGIN 700"),
        (0x110, 700, "table public.t: INSERT: id[integer]:1"),
        (0x120, 700, "table public.a, public.b: TRUNCATE: cascade"),
        (0x130, 700, "COMMIT 700 (at 2026-11-22 01:53:54.095995+00)"),
        (0x140, 0, "message: transactional: 0 prefix: hb, sz: 1 content:x"),
    ]
    asm = TransactionAssembler()
    out = [r for lsn, xid, line in rows for r in asm.feed(dec.decode(line, lsn, xid))]
    assert [change_record_to_json(r) for r in out] == [
        _json("0/130", "0/110", 0, 700, "I", "t", after={"id": "1"}),
        _json("0/130", "0/120", 1, 700, "T", "a"),
        _json("0/130", "0/120", 2, 700, "T", "b"),
        {
            "commit_lsn": "0/140", "lsn": "0/140", "seq": 0, "xid": None, "commit_ts": None,
            "op": "M", "schema_name": None, "table_name": None, "before": None, "after": None,
            "unchanged_toast": [], "message_prefix": "hb", "message_content": "eA==",
            "transactional": False,
        },
    ]


def _json(
    commit_lsn: str, lsn: str, seq: int, xid: int, op: str, table: str, **kw: object
) -> dict[str, object]:
    out: dict[str, object] = {
        "commit_lsn": commit_lsn, "lsn": lsn, "seq": seq, "xid": xid,
        "commit_ts": "2026-11-22T01:53:54.095995Z", "op": op, "schema_name": "public",
        "table_name": table, "before": None, "after": None, "unchanged_toast": [],
        "message_prefix": None, "message_content": None, "transactional": None,
    }
    out.update(kw)
    return out


def test_json_converts_timestamps_to_utc_and_prints_big_lsns() -> None:
    plus2 = datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2)))
    record = ChangeRecord(
        (0x16 << 32) | 0xB374D848, None, 3, 4294967295, plus2, Op.DELETE, "s", "t",
        before={"id": "1", "n": None}, unchanged_toast=("x",),
    )
    assert change_record_to_json(record) == {
        "commit_lsn": "16/B374D848", "lsn": None, "seq": 3, "xid": 4294967295,
        "commit_ts": "2026-01-01T00:00:00.000000Z", "op": "D", "schema_name": "s",
        "table_name": "t", "before": {"id": "1", "n": None}, "after": None,
        "unchanged_toast": ["x"], "message_prefix": None, "message_content": None,
        "transactional": None,
    }


def test_hold_lsn_tracks_the_oldest_unfinished_work() -> None:
    asm = TransactionAssembler()
    assert asm.hold_lsn is None
    asm.feed(StreamStart(9, lsn=50))
    asm.feed(StreamStop())
    assert asm.hold_lsn == 50
    asm.feed(Begin(10, lsn=60))
    asm.feed(Prepare(10, "g", lsn=70))
    asm.feed(Begin(11, lsn=80))
    assert asm.hold_lsn == 50
    asm.feed(StreamAbort(9, 9))
    assert asm.hold_lsn == 60
    asm.feed(RollbackPrepared(10, "g", lsn=90))
    assert asm.hold_lsn == 80
    asm.feed(Commit(11, lsn=95))
    assert asm.hold_lsn is None
