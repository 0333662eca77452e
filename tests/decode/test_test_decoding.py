"""Unit tests for the test_decoding line decoder: one test per line kind and quoting case.

Expected values are written by hand from ``contrib/test_decoding/test_decoding.c``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pgpoll.changes import (
    Begin,
    Column,
    Commit,
    CommitPrepared,
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
from pgpoll.decode.text_decoder import STREAM_CHANGE, STREAM_MESSAGE, STREAM_TRUNCATE, TestDecodingDecoder
from pgpoll.errors import DecodeError

UTC = UTC


@pytest.fixture()
def dec() -> TestDecodingDecoder:
    return TestDecodingDecoder()


# ---- BEGIN / COMMIT ------------------------------------------------------------------


def test_begin_with_xid(dec: TestDecodingDecoder) -> None:
    assert dec.decode("BEGIN 726", lsn=0x16B1970) == Begin(xid=726, lsn=0x16B1970)


def test_begin_without_xid_uses_row_xid(dec: TestDecodingDecoder) -> None:
    assert dec.decode("BEGIN", lsn=5, xid=900) == Begin(xid=900, lsn=5)
    assert dec.decode("BEGIN") == Begin(xid=None)


def test_line_xid_wins_over_row_xid(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("BEGIN 12", xid=99)
    assert isinstance(ev, Begin) and ev.xid == 12


def test_commit_plain_and_without_xid(dec: TestDecodingDecoder) -> None:
    assert dec.decode("COMMIT 726", lsn=10) == Commit(xid=726, lsn=10, end_lsn=10)
    assert dec.decode("COMMIT", lsn=10, xid=3) == Commit(xid=3, lsn=10, end_lsn=10)


def test_commit_with_timestamp(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("COMMIT 726 (at 2026-11-22 01:53:54.095995+00)")
    assert ev == Commit(
        xid=726, commit_ts=datetime(2026, 11, 22, 1, 53, 54, 95995, tzinfo=UTC)
    )
    assert ev.commit_ts is not None and ev.commit_ts.tzinfo is not None


def test_commit_timestamp_without_xid(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("COMMIT (at 2000-01-01 00:00:00+00)")
    assert ev == Commit(xid=None, commit_ts=datetime(2000, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22 01:53:54.5+00", datetime(2026, 11, 22, 1, 53, 54, 500000, tzinfo=UTC)),
        (
            "2026-11-22 07:23:54.095995+05:30",
            datetime(2026, 11, 22, 1, 53, 54, 95995, tzinfo=UTC),
        ),
        ("2026-11-21 22:53:54-03", datetime(2026, 11, 22, 1, 53, 54, tzinfo=UTC)),
        (
            "1900-01-01 00:00:00+00:19:32",
            datetime(1900, 1, 1, tzinfo=timezone(timedelta(minutes=19, seconds=32))),
        ),
    ],
)
def test_commit_timestamp_forms(dec: TestDecodingDecoder, text: str, expected: datetime) -> None:
    ev = dec.decode(f"COMMIT 1 (at {text})")
    assert isinstance(ev, Commit)
    assert ev.commit_ts == expected


# ---- INSERT --------------------------------------------------------------------------


def test_insert_notes_example(dec: TestDecodingDecoder) -> None:
    line = (
        'table public."weird ""tbl"".": INSERT: id[integer]:1 "col:a[b]"[text]:\'x:y\'\'z\' '
        "n[numeric]:NaN arr[integer[]]:'{1,2}'"
    )
    assert dec.decode(line, lsn=42, xid=7) == RowChange(
        op=Op.INSERT,
        schema="public",
        table='weird "tbl".',
        columns=(
            Column("id", "integer"),
            Column("col:a[b]", "text"),
            Column("n", "numeric"),
            Column("arr", "integer[]"),
        ),
        before=None,
        after={"id": "1", "col:a[b]": "x:y'z", "n": "NaN", "arr": "{1,2}"},
        xid=7,
        lsn=42,
    )


def test_insert_quoted_names(dec: TestDecodingDecoder) -> None:
    line = (
        'table "My Schema"."a.b: [c], d": INSERT: "Ünï cødé"[text]:\'ü\' '
        '"select"[integer]:1 "a""b"[integer]:2 "x]:y"[integer]:3'
    )
    ev = dec.decode(line)
    assert isinstance(ev, RowChange)
    assert (ev.schema, ev.table) == ("My Schema", "a.b: [c], d")
    assert ev.after == {"Ünï cødé": "ü", "select": "1", 'a"b': "2", "x]:y": "3"}


@pytest.mark.parametrize(
    "type_name",
    [
        "timestamp with time zone",
        "character varying[]",
        "myschema.mood",
        '"Weird type"',
        'myschema."Weird ""type"" [x]:y"[]',
        '"char"',
        "bit varying",
        "double precision[]",
    ],
)
def test_type_names(dec: TestDecodingDecoder, type_name: str) -> None:
    ev = dec.decode(f"table public.t: INSERT: c[{type_name}]:'v'")
    assert isinstance(ev, RowChange)
    assert ev.columns == (Column("c", type_name),)
    assert ev.after == {"c": "v"}


@pytest.mark.parametrize(
    ("printed", "value"),
    [
        ("1", "1"),
        ("-32768", "-32768"),
        ("9223372036854775807", "9223372036854775807"),
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "-Infinity"),
        ("1.5e-07", "1.5e-07"),
        ("1e+100", "1e+100"),
        ("-0", "-0"),
        ("123.4500", "123.4500"),
        ("B'0101'", "0101"),
        ("B''", ""),
        ("true", "true"),
        ("false", "false"),
        ("null", None),
        ("'null'", "null"),
        ("''", ""),
        ("'it''s'", "it's"),
        ("''''", "'"),
        ("'a\\b\\\\c'", "a\\b\\\\c"),
        ("'line1\nline2\r\n'", "line1\nline2\r\n"),
        ("' x[integer]:1 y[text]:''z'''", " x[integer]:1 y[text]:'z'"),
        ("' new-tuple: a[integer]:1'", " new-tuple: a[integer]:1"),
        ("'{\"a b\",NULL,\"c\\\\\"\"d\"}'", '{"a b",NULL,"c\\\\""d"}'),
        ("'2026-11-22 01:53:54.095995+00'", "2026-11-22 01:53:54.095995+00"),
    ],
)
def test_values(dec: TestDecodingDecoder, printed: str, value: str | None) -> None:
    ev = dec.decode(f"table public.t: INSERT: a[sometype]:{printed} b[integer]:2")
    assert isinstance(ev, RowChange)
    assert ev.after == {"a": value, "b": "2"}


def test_unchanged_toast(dec: TestDecodingDecoder) -> None:
    line = "table public.t: UPDATE: id[integer]:1 big[text]:unchanged-toast-datum n[integer]:2"
    ev = dec.decode(line)
    assert ev == RowChange(
        op=Op.UPDATE,
        schema="public",
        table="t",
        columns=(Column("id", "integer"), Column("big", "text"), Column("n", "integer")),
        before=None,
        after={"id": "1", "n": "2"},
        unchanged_toast=("big",),
    )


def test_insert_no_tuple_data_and_no_columns(dec: TestDecodingDecoder) -> None:
    assert dec.decode("table public.t: INSERT: (no-tuple-data)") == RowChange(
        Op.INSERT, "public", "t", (), None, None
    )
    assert dec.decode("table public.t: INSERT:") == RowChange(Op.INSERT, "public", "t", (), None, {})


def test_repeated_lines_reuse_templates(dec: TestDecodingDecoder) -> None:
    first = dec.decode("table public.t: INSERT: a[integer]:1 b[text]:'x'")
    second = dec.decode("table public.t: INSERT: a[integer]:2 b[text]:null")
    third = dec.decode("table public.t: INSERT: a[integer]:3 b[text]:unchanged-toast-datum")
    changed = dec.decode("table public.t: INSERT: a[integer]:4")
    assert isinstance(first, RowChange) and isinstance(second, RowChange)
    assert first.after == {"a": "1", "b": "x"}
    assert second.after == {"a": "2", "b": None}
    assert isinstance(third, RowChange) and third.unchanged_toast == ("b",)
    assert third.after == {"a": "3"}
    assert isinstance(changed, RowChange) and changed.after == {"a": "4"}
    assert first.columns == second.columns


# ---- UPDATE / DELETE ---------------------------------------------------------------


def test_update_without_old_key(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("table public.t: UPDATE: id[integer]:1 v[text]:'new'")
    assert isinstance(ev, RowChange)
    assert (ev.op, ev.before, ev.after) == (Op.UPDATE, None, {"id": "1", "v": "new"})


def test_update_with_old_key(dec: TestDecodingDecoder) -> None:
    line = (
        "table public.t: UPDATE: old-key: id[integer]:1 v[text]:' new-tuple: x' "
        "new-tuple: id[integer]:2 v[text]:'b'"
    )
    ev = dec.decode(line)
    assert ev == RowChange(
        op=Op.UPDATE,
        schema="public",
        table="t",
        columns=(Column("id", "integer"), Column("v", "text")),
        before={"id": "1", "v": " new-tuple: x"},
        after={"id": "2", "v": "b"},
    )


def test_update_old_key_with_quoted_column_named_new_tuple(dec: TestDecodingDecoder) -> None:
    line = 'table public.t: UPDATE: old-key: "new-tuple:"[integer]:1 new-tuple: "new-tuple:"[integer]:2'
    ev = dec.decode(line)
    assert isinstance(ev, RowChange)
    assert ev.before == {"new-tuple:": "1"} and ev.after == {"new-tuple:": "2"}


def test_update_empty_old_key(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("table public.t: UPDATE: old-key: new-tuple: id[integer]:1")
    assert isinstance(ev, RowChange)
    assert ev.before == {} and ev.after == {"id": "1"}


def test_update_no_tuple_data(dec: TestDecodingDecoder) -> None:
    assert dec.decode("table public.t: UPDATE: (no-tuple-data)") == RowChange(
        Op.UPDATE, "public", "t", (), None, None
    )


def test_delete_with_key_and_without(dec: TestDecodingDecoder) -> None:
    assert dec.decode("table public.t: DELETE: id[integer]:1", lsn=9, xid=4) == RowChange(
        Op.DELETE, "public", "t", (Column("id", "integer"),), {"id": "1"}, None, xid=4, lsn=9
    )
    assert dec.decode("table public.t: DELETE: (no-tuple-data)") == RowChange(
        Op.DELETE, "public", "t", (), None, None
    )


# ---- TRUNCATE ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "restart", "cascade"),
    [
        ("(no-flags)", False, False),
        ("restart_seqs", True, False),
        ("cascade", False, True),
        ("restart_seqs cascade", True, True),
    ],
)
def test_truncate_flags(dec: TestDecodingDecoder, flags: str, restart: bool, cascade: bool) -> None:
    ev = dec.decode(f"table public.tab1: TRUNCATE: {flags}", lsn=3, xid=8)
    assert ev == Truncate((("public", "tab1"),), cascade=cascade, restart_identity=restart, xid=8, lsn=3)


def test_truncate_several_tables_with_hostile_names(dec: TestDecodingDecoder) -> None:
    line = 'table public.tab1, "s, t"."a: b", public."x""y": TRUNCATE: restart_seqs cascade'
    assert dec.decode(line) == Truncate(
        (("public", "tab1"), ("s, t", "a: b"), ("public", 'x"y')),
        cascade=True,
        restart_identity=True,
    )


# ---- messages ------------------------------------------------------------------------


def test_messages(dec: TestDecodingDecoder) -> None:
    assert dec.decode("message: transactional: 1 prefix: test, sz: 4 content:msg1", lsn=1) == (
        LogicalMessage(True, "test", b"msg1", lsn=1)
    )
    assert dec.decode("message: transactional: 0 prefix: p, sz: 0 content:") == (
        LogicalMessage(False, "p", b"")
    )


def test_message_content_counts_bytes_and_may_hold_lines(dec: TestDecodingDecoder) -> None:
    content = "čeština\nBEGIN 5\ntable public.t: INSERT: a[integer]:1"
    size = len(content.encode())
    ev = dec.decode(f"message: transactional: 1 prefix: pfx, sz: {size} content:{content}")
    assert ev == LogicalMessage(True, "pfx", content.encode())


def test_message_content_embedding_a_message_line(dec: TestDecodingDecoder) -> None:
    inner = "message: transactional: 1 prefix: x, sz: 3 content:abc"
    ev = dec.decode(f"message: transactional: 0 prefix: outer, sz: {len(inner)} content:{inner}")
    assert ev == LogicalMessage(False, "outer", inner.encode())


def test_message_prefix_holding_sz_text(dec: TestDecodingDecoder) -> None:
    line = "message: transactional: 1 prefix: a, sz: 99 content:b, sz: 2 content:hi"
    assert dec.decode(line) == LogicalMessage(True, "a, sz: 99 content:b", b"hi")
    assert dec.decode("message: transactional: 1 prefix: , sz: 1 content:x") == (
        LogicalMessage(True, "", b"x")
    )


def test_message_with_wrong_size_fails(dec: TestDecodingDecoder) -> None:
    with pytest.raises(DecodeError) as err:
        dec.decode("message: transactional: 1 prefix: p, sz: 5 content:abc")
    assert err.value.offset == 34


# ---- two-phase -------------------------------------------------------------------------


def test_prepare_forms(dec: TestDecodingDecoder) -> None:
    assert dec.decode("PREPARE TRANSACTION 'test_prepared#1'", lsn=5, xid=9) == Prepare(
        xid=9, gid="test_prepared#1", lsn=5, end_lsn=5
    )
    ev = dec.decode("PREPARE TRANSACTION 'g', txid 745 (at 2026-01-02 03:04:05.06+00)")
    assert ev == Prepare(
        xid=745, gid="g", prepare_ts=datetime(2026, 1, 2, 3, 4, 5, 60000, tzinfo=UTC)
    )


def test_gid_quoting(dec: TestDecodingDecoder) -> None:
    ev = dec.decode("COMMIT PREPARED 'it''s, txid 5', txid 6")
    assert isinstance(ev, CommitPrepared) and ev.gid == "it's, txid 5"
    ev = dec.decode("ROLLBACK PREPARED E'a\\\\b''c', txid 7")
    assert ev == RollbackPrepared(xid=7, gid="a\\b'c")


def test_commit_and_rollback_prepared(dec: TestDecodingDecoder) -> None:
    assert dec.decode("COMMIT PREPARED 'g1'", lsn=8) == CommitPrepared(
        xid=None, gid="g1", lsn=8, end_lsn=8
    )
    ev = dec.decode("ROLLBACK PREPARED 'g2', txid 12 (at 2026-01-02 03:04:05+00)", lsn=8)
    assert ev == RollbackPrepared(
        xid=12,
        gid="g2",
        lsn=8,
        rollback_end_lsn=8,
        rollback_ts=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


# ---- streaming -------------------------------------------------------------------------


def test_stream_framing_with_xids(dec: TestDecodingDecoder) -> None:
    assert dec.decode("opening a streamed block for transaction TXN 508", lsn=1) == StreamStart(
        xid=508, lsn=1
    )
    assert dec.decode("closing a streamed block for transaction TXN 508", lsn=2) == StreamStop(lsn=2)
    assert dec.decode("aborting streamed (sub)transaction TXN 509", lsn=3) == StreamAbort(
        xid=509, subxid=509, lsn=3, abort_lsn=3
    )
    assert dec.decode("committing streamed transaction TXN 508 (at 2026-01-01 00:00:00+00)") == (
        StreamCommit(xid=508, commit_ts=datetime(2026, 1, 1, tzinfo=UTC))
    )


def test_stream_framing_without_xids(dec: TestDecodingDecoder) -> None:
    assert dec.decode("opening a streamed block for transaction") == StreamStart(xid=0)
    assert dec.decode("opening a streamed block for transaction", xid=77) == StreamStart(xid=77)
    assert dec.decode("closing a streamed block for transaction") == StreamStop()
    assert dec.decode("aborting streamed (sub)transaction") == StreamAbort(xid=0, subxid=0)
    assert dec.decode("committing streamed transaction", lsn=4) == StreamCommit(xid=0, lsn=4, end_lsn=4)


def test_streamed_changes_are_opaque(dec: TestDecodingDecoder) -> None:
    assert dec.decode("streaming change for TXN 508", lsn=1) == Ignored(STREAM_CHANGE, lsn=1)
    assert dec.decode("streaming change for transaction") == Ignored(STREAM_CHANGE)
    assert dec.decode("streaming truncate for TXN 508") == Ignored(STREAM_TRUNCATE)
    assert dec.decode("streaming truncate for transaction") == Ignored(STREAM_TRUNCATE)
    line = "streaming message: transactional: 1 prefix: test, sz: 50"
    assert dec.decode(line) == Ignored(STREAM_MESSAGE)
    assert dec.decode("streaming message: transactional: 1 prefix: a, sz: 1, sz: 50") == (
        Ignored(STREAM_MESSAGE)
    )


def test_streamed_non_transactional_message(dec: TestDecodingDecoder) -> None:
    line = "streaming message: transactional: 0 prefix: p, sz: 2 content:hi"
    assert dec.decode(line, lsn=3) == LogicalMessage(False, "p", b"hi", lsn=3)


def test_preparing_streamed_transaction(dec: TestDecodingDecoder) -> None:
    assert dec.decode("preparing streamed transaction 'test1'") == Prepare(
        xid=None, gid="test1", streamed=True
    )
    ev = dec.decode("preparing streamed transaction TXN 'test1', txid 610 (at 2026-01-01 00:00:00+00)")
    assert ev == Prepare(
        xid=610,
        gid="test1",
        prepare_ts=datetime(2026, 1, 1, tzinfo=UTC),
        streamed=True,
    )


# ---- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "offset"),
    [
        ("", 0),
        ("hello", 0),
        ("BEGIN x", 5),
        ("COMMIT 1 (at yesterday)", 13),
        ("COMMIT 1 (at 2026-02-30 00:00:00+00)", 13),
        ("BEGIN 99999999999", 6),
        ("table public: INSERT: a[integer]:1", 6),
        ("table public.t: INSERT: a[integer]:'unterminated", 35),
        ("table public.t: INSERT: a[integer]:1 b[text]:oops", 45),
        ("table public.t: INSERT: a[integer]:1x", 35),
        ("table public.t: INSERT: a[integer]:B'012'", 35),
        ("table public.t: INSERT: a[integer]:'x'y", 35),
        ("table public.t: INSERT: a[integer]:1 b", 36),
        ("table public.t: UPSERT: a[integer]:1", 14),
        ("table public.t: UPDATE: old-key: a[integer]:1", 45),
        ("table public.t: TRUNCATE: everything", 25),
        ("table public.t, : TRUNCATE: cascade", 16),
        ("message: transactional: 2 prefix: p, sz: 0 content:", 24),
        ("message: transactional: 1 prefix: p", 34),
        ("PREPARE TRANSACTION g", 20),
        ("PREPARE TRANSACTION 'g' junk", 23),
        ("streaming change for TXN x", 21),
        ("streaming message: transactional: 1 prefix: p, sz: x", 44),
    ],
)
def test_bad_lines_raise_decode_error_with_offset(
    dec: TestDecodingDecoder, line: str, offset: int
) -> None:
    with pytest.raises(DecodeError) as err:
        dec.decode(line, lsn=0x16B1970)
    assert err.value.offset == offset
    assert err.value.lsn == "0/16B1970"


@pytest.mark.parametrize("bad", [None, b"BEGIN 1", 5])
def test_non_text_input_raises_decode_error(dec: TestDecodingDecoder, bad: object) -> None:
    with pytest.raises(DecodeError):
        dec.decode(bad)  # type: ignore[arg-type]


def test_decode_error_pickles(dec: TestDecodingDecoder) -> None:
    import pickle

    with pytest.raises(DecodeError) as err:
        dec.decode("table public.t: INSERT: a[integer]:zz")
    again = pickle.loads(pickle.dumps(err.value))
    assert isinstance(again, DecodeError) and again.offset == err.value.offset
