"""Hand-made and fuzzed pgoutput messages: edge cases, errors, robustness.

Messages are built here byte by byte (``relation``, ``insert``...) following
the documented layouts. The fuzz tests (hypothesis, derandomized, bounded)
check that malformed input -- truncations and bit flips of the real golden
messages, random bytes -- only ever raises :class:`DecodeError`, never
``IndexError``/``struct.error``/``UnicodeDecodeError``, and that the fast path
(``decode_row``) agrees with the reference parser on generated tuples.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgpoll import changes as ch
from pgpoll.decode import pgoutput_messages as m
from pgpoll.decode.pgoutput_decoder import UNCHANGED_TOAST, PgoutputDecoder, parse_message
from pgpoll.errors import ConfigError, DecodeError

GOLDEN = Path(__file__).parent / "golden" / "pgoutput"
FUZZ = settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Val = None | str | bytes | tuple[str, bytes] | object


def cstr(s: str) -> bytes:
    return s.encode() + b"\x00"


def xid_part(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def relation(
    relid: int = 16385, ns: str = "public", name: str = "t",
    cols: Sequence[tuple[str, int, int]] = (("id", 23, 1), ("v", 25, 0)), ident: bytes = b"d", xid: int | None = None,
) -> bytes:
    body = b"".join(struct.pack("!B", flags) + cstr(n) + struct.pack("!Ii", oid, -1) for n, oid, flags in cols)
    return b"R" + xid_part(xid) + struct.pack("!I", relid) + cstr(ns) + cstr(name) + ident + struct.pack("!H", len(cols)) + body


def tup(*vals: Val) -> bytes:
    """TupleData: None -> 'n', UNCHANGED_TOAST -> 'u', str/bytes -> 't', ('b', raw) -> 'b'."""
    out = [struct.pack("!H", len(vals))]
    for v in vals:
        if v is None:
            out.append(b"n")
        elif v is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(v, tuple):
            out.append(b"b" + struct.pack("!I", len(v[1])) + v[1])
        else:
            raw = v.encode() if isinstance(v, str) else v
            assert isinstance(raw, bytes)
            out.append(b"t" + struct.pack("!I", len(raw)) + raw)
    return b"".join(out)


def insert(*vals: Val, relid: int = 16385, xid: int | None = None) -> bytes:
    return b"I" + xid_part(xid) + struct.pack("!I", relid) + b"N" + tup(*vals)


def update(new: Sequence[Val], old: Sequence[Val] | None = None, kind: bytes = b"K", relid: int = 16385) -> bytes:
    old_part = b"" if old is None else kind + tup(*old)
    return b"U" + struct.pack("!I", relid) + old_part + b"N" + tup(*new)


def delete(old: Sequence[Val], kind: bytes = b"K", relid: int = 16385) -> bytes:
    return b"D" + struct.pack("!I", relid) + kind + tup(*old)


def decoder(*messages: bytes, proto: int = 1, streaming: bool = False) -> PgoutputDecoder:
    dec = PgoutputDecoder(proto, streaming)
    for msg in messages:
        dec.decode(msg)
    return dec


# ---- hand-made: what real servers rarely show ------------------------------------


def test_empty_namespace_means_pg_catalog() -> None:
    msg = parse_message(relation(ns=""), 1)
    assert isinstance(msg, m.Relation) and (msg.namespace, msg.schema) == ("", "pg_catalog")
    typ = b"Y" + struct.pack("!I", 16) + cstr("") + cstr("bool")
    assert parse_message(typ, 1) == m.Type(None, 16, "", "bool")
    dec = decoder(relation(ns=""), typ)
    assert dec.types == {16: ("pg_catalog", "bool")}
    ev = dec.decode(insert("1", "x"))
    assert isinstance(ev, ch.RowChange) and (ev.schema, ev.table) == ("pg_catalog", "t")


def test_changes_inside_a_stream_carry_their_xid() -> None:
    dec = decoder(proto=2, streaming=True)
    assert dec.decode(b"S" + struct.pack("!IB", 900, 1), 10) == ch.StreamStart(900, True, 10)
    assert dec.in_stream
    assert dec.decode(relation(xid=900)) == ch.Ignored("relation", None)
    row = dec.decode_row(insert("1", "a", xid=901))
    assert row is not None and row[2] == 901 and row[5] == ["1", "a"]
    ev = dec.decode(insert("2", None, xid=901), 11)
    assert isinstance(ev, ch.RowChange) and (ev.xid, ev.after, ev.lsn) == (901, {"id": "2", "v": None}, 11)
    assert dec.decode(b"E") == ch.StreamStop(None)
    assert not dec.in_stream
    abort = b"A" + struct.pack("!II", 900, 901)
    assert dec.decode(abort) == ch.StreamAbort(900, 901)


def test_old_tuples_keep_key_columns_and_drop_unchanged_toast() -> None:
    cols = (("a", 23, 1), ("big", 25, 0), ("c", 23, 1))
    dec = decoder(relation(cols=cols))
    ev = dec.decode(update(["1", UNCHANGED_TOAST, "3"], old=["1", None, "2"], kind=b"K"))
    assert isinstance(ev, ch.RowChange)
    assert (ev.before, ev.before_is_key) == ({"a": "1", "c": "2"}, True)
    assert (ev.after, ev.unchanged_toast) == ({"a": "1", "c": "3"}, ("big",))
    ev = dec.decode(delete(["1", UNCHANGED_TOAST, None], kind=b"O"))
    assert isinstance(ev, ch.RowChange) and (ev.before, ev.before_is_key, ev.after) == ({"a": "1", "c": None}, False, None)
    fields = dec.decode_row(update(["1", "x", "3"], old=["1", None, "2"]))
    assert fields is not None and fields[3] == ["1", None, "2"] and fields[1].key_indexes == (0, 2)


def test_binary_values_are_hex_text_of_the_sent_bytes() -> None:
    dec = decoder(relation())
    ev = dec.decode(insert(("b", b"\x00\x00\x00\x07"), ("b", b"")))
    assert isinstance(ev, ch.RowChange) and ev.after == {"id": "\\x00000007", "v": "\\x"}


def test_decode_row_accepts_any_buffer_and_ignores_other_messages() -> None:
    dec = decoder(relation())
    msg = insert("1", "é")
    for data in (msg, bytearray(msg), memoryview(msg), memoryview(msg).cast("c")):
        fields = dec.decode_row(data)
        assert fields is not None and fields[0] is ch.Op.INSERT and fields[5] == ["1", "é"]
    assert dec.decode_row(b"E") is None and dec.decode_row(b"") is None


# ---- hand-made errors -------------------------------------------------------------------------


DISPATCHED = {ord(k) for k in m.MESSAGE_NAMES}


@pytest.mark.parametrize("first", sorted(set(range(256)) - DISPATCHED))
def test_wrong_first_byte_raises(first: int) -> None:
    data = bytes([first]) + b"\x00" * 8
    with pytest.raises(DecodeError, match="unsupported message type") as info:
        parse_message(data, 4)
    assert info.value.offset == 0
    with pytest.raises(DecodeError, match="unsupported message type"):
        decoder(proto=4, streaming=True).decode(data)


@pytest.mark.parametrize(
    ("data", "proto", "match"),
    [
        (b"", 1, "empty"),
        (b"E", 1, "needs proto_version 2"),
        (b"P" + b"\x00" * 29 + b"\x00", 2, "needs proto_version 3"),
        (b"C\x01" + b"\x00" * 24, 1, "unrecognized flags 1"),
        (b"C\x00" + b"\x00" * 23, 1, "needs 8 bytes, 7 left"),
        (insert("1", "a")[:-1], 1, "column value needs 1 bytes, 0 left"),
        (insert("1", "a") + b"\x00", 1, "1 unexpected trailing bytes"),
        (b"I" + struct.pack("!I", 1) + b"X" + tup("1"), 1, "expected tuple type N, got 'X'"),
        (b"I" + struct.pack("!I", 1) + b"N\x00\x01x", 1, "unknown TupleData column kind 'x'"),
        (b"T" + struct.pack("!IB", 2**30, 0) + b"\x00" * 8, 1, "relation OIDs need"),
        (b"R" + struct.pack("!I", 1) + b"public", 1, "no terminating NUL"),
    ],
)
def test_malformed_messages_raise(data: bytes, proto: int, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        parse_message(data, proto)


def test_bad_protocol_versions_are_usage_errors() -> None:
    for bad in (0, 5):
        with pytest.raises(ConfigError):
            PgoutputDecoder(bad)
        with pytest.raises(ConfigError):
            parse_message(b"E", bad)
    with pytest.raises(ConfigError):
        PgoutputDecoder(1, streaming=True)


def test_change_before_its_relation_raises_with_relation_and_lsn() -> None:
    with pytest.raises(DecodeError, match="before its Relation message") as info:
        decoder().decode(insert("1", "a", relid=77), 0x1_0000_00A0)
    assert (info.value.relation, info.value.lsn, info.value.message_type) == ("77", "1/A0", "Insert")
    with pytest.raises(DecodeError, match="Truncate of relation 77"):
        decoder().decode(b"T" + struct.pack("!IBI", 1, 0, 77))


def test_tuple_width_must_match_the_relation() -> None:
    with pytest.raises(DecodeError, match=r"tuple has 3 columns, relation public\.t has 2"):
        decoder(relation()).decode(insert("1", "a", "extra"))


def test_invalid_utf8_text_value_raises() -> None:
    with pytest.raises(DecodeError, match="column 2 is not valid UTF-8"):
        decoder(relation()).decode(insert("1", b"\xff\xfe"))


def test_stream_state_is_checked() -> None:
    start = b"S" + struct.pack("!IB", 5, 1)
    with pytest.raises(DecodeError, match="streaming=False"):
        decoder(proto=2).decode(start)
    with pytest.raises(DecodeError, match="Stream Stop message outside a stream block"):
        decoder(proto=2, streaming=True).decode(b"E")
    with pytest.raises(DecodeError, match="Stream Start message inside a stream block"):
        decoder(start, proto=2, streaming=True).decode(start)
    with pytest.raises(DecodeError, match="Stream Commit message inside"):
        decoder(start, proto=2, streaming=True).decode(b"c" + struct.pack("!IBQQq", 5, 0, 1, 2, 3))


def test_an_error_leaves_the_decoder_state_unchanged() -> None:
    dec = decoder(relation(), b"B" + struct.pack("!QqI", 100, 0, 42))
    for bad in (relation(cols=(("x", 23, 0),))[:-3], insert("1"), b"C\x01" + b"\x00" * 24):
        with pytest.raises(DecodeError):
            dec.decode(bad)
    assert dec.relations[16385].names == ("id", "v")
    ev = dec.decode(b"C\x00" + struct.pack("!QQq", 100, 148, 0))
    assert isinstance(ev, ch.Commit) and ev.xid == 42


# ---- fuzzing the golden messages ------------------------------------------------------------


@cache
def golden(name: str) -> tuple[int, bool, tuple[bytes, ...]]:
    rows = [json.loads(line) for line in (GOLDEN / f"{name}.jsonl").read_text().splitlines()]
    streaming = rows[0]["options"].get("streaming", "off") != "off"
    return rows[0]["proto_version"], streaming, tuple(bytes.fromhex(r["data_hex"]) for r in rows)


SMALL = sorted(
    str(p.relative_to(GOLDEN))[:-6] for p in GOLDEN.glob("pg*/*.jsonl") if not p.name.startswith("stream") or "pg15" not in str(p)
)


def _allowed_prefix(data: bytes, k: int) -> bool:
    """A prefix that is itself a valid message: a protocol-4 Stream Abort without its abort info."""
    return data[0] == ord("A") and k == 9


@pytest.mark.parametrize("name", SMALL)
def test_every_truncation_of_golden_messages_raises_decode_error(name: str) -> None:
    proto, streaming, datas = golden(name)
    dec = PgoutputDecoder(proto, streaming)
    for data in datas:
        for k in range(len(data)):
            if _allowed_prefix(data, k):
                continue
            with pytest.raises(DecodeError):
                dec.decode(data[:k])
        dec.decode(data)


def _replayed(name: str, index: int) -> tuple[PgoutputDecoder, bytes]:
    proto, streaming, datas = golden(name)
    dec = PgoutputDecoder(proto, streaming)
    for data in datas[:index]:
        dec.decode(data)
    return dec, datas[index]


@FUZZ
@given(name=st.sampled_from(SMALL), pick=st.integers(0, 10**6), bit=st.integers(0, 10**6))
def test_bit_flips_raise_only_decode_error(name: str, pick: int, bit: int) -> None:
    datas = golden(name)[2]
    dec, data = _replayed(name, pick % len(datas))
    pos = bit % (len(data) * 8)
    flipped = bytearray(data)
    flipped[pos // 8] ^= 1 << (pos % 8)
    try:
        event = dec.decode(bytes(flipped), 1)
    except DecodeError:
        return  # the only error allowed; anything else fails the test
    assert dataclasses.is_dataclass(event), "a flipped message that decodes must still give a change-model event"


@FUZZ
@given(first=st.sampled_from(sorted(DISPATCHED)), rest=st.binary(max_size=64), proto=st.integers(1, 4))
def test_random_bodies_raise_only_decode_error(first: int, rest: bytes, proto: int) -> None:
    dec = decoder(relation(), proto=proto, streaming=proto > 1)
    try:
        event = dec.decode(bytes([first]) + rest)
    except DecodeError:
        return  # the only error allowed; anything else fails the test
    assert dataclasses.is_dataclass(event), "a body that decodes must still give a change-model event"


# ---- the fast path against the reference parser ----------------------------------------------

VALUE = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(max_size=12),
    st.binary(max_size=6),
    st.tuples(st.just("b"), st.binary(max_size=6)),
)


def reference(tup_: m.TupleData | None) -> list[Any] | None:
    if tup_ is None:
        return None
    out: list[Any] = []
    for kind, raw in zip(tup_.kinds, tup_.values, strict=False):
        if kind in "tb" and raw is not None:
            out.append(raw.decode() if kind == "t" else "\\x" + raw.hex())
        else:
            out.append(UNCHANGED_TOAST if kind == "u" else None)
    return out


@FUZZ
@given(
    new=st.lists(VALUE, min_size=1, max_size=5),
    old=st.one_of(st.none(), st.lists(VALUE, min_size=1, max_size=5)),
    op=st.sampled_from("IUD"),
    kind=st.sampled_from([b"K", b"O"]),
)
def test_fast_path_agrees_with_reference(new: list[Val], old: list[Val] | None, op: str, kind: bytes) -> None:
    width = len(new)
    cols = tuple((f"c{i}", 25, i % 2) for i in range(width))
    dec = decoder(relation(cols=cols))
    if old is not None:
        old = (old + [None] * width)[:width]
    data = insert(*new) if op == "I" else update(new, old, kind) if op == "U" else delete(old or new, kind)
    try:
        msg = parse_message(data, 1)
        expected: Any = None
        if isinstance(msg, m.Insert):
            expected = (None, False, reference(msg.new))
        elif isinstance(msg, m.Update):
            expected = (reference(msg.old), msg.old_kind == "K", reference(msg.new))
        elif isinstance(msg, m.Delete):
            expected = (reference(msg.old), msg.old_kind == "K", None)
    except UnicodeDecodeError:
        with pytest.raises(DecodeError, match="not valid UTF-8"):
            dec.decode_row(data)
        return
    fields = dec.decode_row(data)
    assert fields is not None and (fields[3], fields[4], fields[5]) == expected
