"""The decoder factory and the plugin-neutral fast row shape (``pgpoll.decode.decoders``, ``pgpoll.changes``)."""

from __future__ import annotations

import pickle

import pytest

from pgpoll import changes as ch
from pgpoll.changes import UNCHANGED_TOAST, RelationInfo, split_row
from pgpoll.decode.decoders import Decoder, make_decoder
from pgpoll.errors import ConfigError, DecodeError
from tests.decode.test_pgoutput_fuzz import delete, insert, relation, update

COLS = (("a", 23, 1), ("big", 25, 0), ("c", 23, 1))


def test_pgoutput_decoder_exposes_its_fast_path_and_type_names() -> None:
    decode: Decoder = make_decoder("pgoutput", 1)
    assert decode.plugin == "pgoutput" and decode.fast_row is not None
    assert decode(relation(cols=COLS), 10, None) == ch.Ignored("relation", 10)
    assert decode(b"Y" + (16).to_bytes(4, "big") + b"pg_catalog\x00bool\x00", 11, None) == ch.Ignored("type", 11)
    assert decode.type_names == {16: ("pg_catalog", "bool")}
    row = decode.fast_row(insert("1", "x", "3"))
    assert row is not None
    assert (row[ch.ROW_OP], row[ch.ROW_RELATION].table, row[ch.ROW_AFTER]) == (ch.Op.INSERT, "t", ["1", "x", "3"])
    assert decode.fast_row(b"E") is None
    event = decode(insert("2", None, "4"), 12, 99)
    assert isinstance(event, ch.RowChange) and (event.after, event.lsn) == ({"a": "2", "big": None, "c": "4"}, 12)


def test_test_decoding_decoder_takes_utf8_bytes_or_text_and_has_no_fast_path() -> None:
    decode = make_decoder("test_decoding", 1)
    assert decode.plugin == "test_decoding" and decode.fast_row is None and dict(decode.type_names) == {}
    assert decode(b"BEGIN 726", 5, None) == ch.Begin(xid=726, lsn=5)
    assert decode(memoryview(b"COMMIT 726"), 6, None) == ch.Commit(xid=726, lsn=6, end_lsn=6)
    assert decode("BEGIN", 7, 8) == ch.Begin(xid=8, lsn=7)
    with pytest.raises(DecodeError, match=r"test_decoding row at 0/10 is not valid UTF-8 \(byte 6\)") as err:
        decode(b"BEGIN \xff", 16, None)
    assert (err.value.offset, err.value.lsn) == (6, "0/10")


def test_an_unknown_plugin_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="unknown output plugin 'wal2json'"):
        make_decoder("wal2json", 1)


def _rel() -> RelationInfo:
    cols = tuple(ch.Column(n, None, oid, -1, bool(key)) for n, oid, key in COLS)
    return RelationInfo(16385, "public", "t", cols, "d")


def test_relation_info_derives_names_width_and_key_positions() -> None:
    rel = _rel()
    assert (rel.names, rel.width, rel.key_indexes, rel.key_names) == (("a", "big", "c"), 3, (0, 2), ("a", "c"))


def test_split_row_without_unchanged_toast_passes_the_lists_through() -> None:
    rel = _rel()
    after = ["1", "x", None]
    before_names, before_values, after_names, after_values, toast = split_row((ch.Op.INSERT, rel, 7, None, False, after))
    assert (before_names, before_values, toast) == (None, (), [])
    assert after_names is rel.names and after_values is after


def test_split_row_keeps_key_columns_of_a_key_tuple_and_leaves_unchanged_toast_out() -> None:
    rel = _rel()
    row = (ch.Op.UPDATE, rel, None, ["1", None, "2"], True, ["1", UNCHANGED_TOAST, "3"])
    assert [list(part) for part in split_row(row)] == [["a", "c"], ["1", "2"], ["a", "c"], ["1", "3"], ["big"]]
    full_old = (ch.Op.DELETE, rel, None, ["1", UNCHANGED_TOAST, None], False, None)
    assert split_row(full_old) == (["a", "c"], ["1", None], None, (), [])
    key_with_toast = (ch.Op.DELETE, rel, None, ["1", None, UNCHANGED_TOAST], True, None)
    assert split_row(key_with_toast) == (["a"], ["1"], None, (), [])


def test_the_fast_path_and_the_events_agree_through_split_row() -> None:
    decode = make_decoder("pgoutput", 1)
    decode(relation(cols=COLS), None, None)
    assert decode.fast_row is not None
    for data in (
        insert("1", UNCHANGED_TOAST, "3"),
        update(["1", UNCHANGED_TOAST, "3"], old=["1", None, "2"], kind=b"K"),
        update(["1", "y", "3"], old=["1", "x", None], kind=b"O"),
        delete(["1", None, "2"], kind=b"K"),
    ):
        row = decode.fast_row(data)
        event = decode(data, None, None)
        assert row is not None and isinstance(event, ch.RowChange)
        bn, bv, an, av, toast = split_row(row)
        assert event.before == (None if bn is None else dict(zip(bn, bv, strict=True)))
        assert event.after == (None if an is None else dict(zip(an, av, strict=True)))
        assert (event.unchanged_toast, event.before_is_key) == (tuple(toast), row[ch.ROW_BEFORE_IS_KEY])


def test_unchanged_toast_is_one_object_even_through_pickle() -> None:
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_the_heartbeat_prefix_is_the_same_constant_where_the_assembler_reexports_it() -> None:
    from pgpoll.ingest.batch_assembler import HEARTBEAT_PREFIX

    assert HEARTBEAT_PREFIX is ch.HEARTBEAT_PREFIX == "pgpoll.heartbeat"
