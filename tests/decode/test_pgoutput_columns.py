"""The column-wise Insert decoder gives exactly what the row-by-row fast path gives, or declines.

Messages are built byte by byte (the helpers of ``test_pgoutput_fuzz``); the
reference is :meth:`PgoutputDecoder.decode_row` plus :func:`split_row`, one
row at a time. Generated relations (booleans among them) and values (nulls,
empty strings, any Unicode, ``t``/``f`` and other text in boolean columns)
go through :func:`insert_run_after` from both ways a chunk is laid out
(psycopg2's values, ADBC's Arrow column, also a sliced one), and every
malformation the row path would reject makes it return ``None``.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgpoll.changes import split_row
from pgpoll.decode.pgoutput_columns import PeekChunk, insert_run_after
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.decode.pgoutput_tuples import PgoutputRelation
from tests.decode.test_pgoutput_fuzz import insert, relation, tup

FUZZ = settings(derandomize=True, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_BOOL, _TEXT = 16, 25


def _decoder(cols: list[tuple[str, int, int]], relid: int = 16385) -> tuple[PgoutputDecoder, PgoutputRelation]:
    dec = PgoutputDecoder(1)
    dec.decode(relation(relid=relid, cols=cols))
    return dec, dec.relations[relid]


def _rows(dec: PgoutputDecoder, messages: list[bytes]) -> list[list[tuple[str, Any]]]:
    """The reference: each message through the row fast path, as ``after`` name/value pairs."""
    out = []
    for msg in messages:
        row = dec.decode_row(msg)
        assert row is not None
        _bn, _bv, names, values, toast = split_row(row)
        assert names is not None and not toast
        out.append(list(zip(names, values, strict=True)))
    return out


def _columns(after: pa.MapArray) -> list[list[tuple[str, Any]]]:
    return [list(pairs) for pairs in after.to_pylist()]


def _chunks(messages: list[bytes]) -> list[PeekChunk]:
    """The same messages laid out as psycopg2 gives them, as ADBC gives them, and as a slice of a larger column."""
    padded = pa.array([b"B" * 21, *messages, b"C" * 26], pa.binary()).slice(1, len(messages))
    return [PeekChunk.of_values([memoryview(m) for m in messages]), PeekChunk.of_arrow(pa.array(messages, pa.binary())),
            PeekChunk.of_arrow(padded)]


_names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), min_size=1, max_size=8)
_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)


@st.composite
def _runs(draw: Any) -> tuple[list[tuple[str, int, int]], list[list[str | None]]]:
    width = draw(st.integers(1, 6))
    names = draw(st.lists(_names, min_size=width, max_size=width, unique=True))
    oids = draw(st.lists(st.sampled_from([_BOOL, _TEXT, 23]), min_size=width, max_size=width))
    cols = [(n, oid, 1 if i == 0 else 0) for i, (n, oid) in enumerate(zip(names, oids, strict=True))]
    value = st.one_of(st.none(), _text, st.sampled_from(["t", "f", "", "true", "tt"]))
    rows = draw(st.lists(st.lists(value, min_size=width, max_size=width), min_size=1, max_size=40))
    return cols, rows


@FUZZ
@given(_runs())
def test_columns_equal_the_row_path(run: tuple[list[tuple[str, int, int]], list[list[str | None]]]) -> None:
    cols, rows = run
    dec, rel = _decoder(cols)
    messages = [insert(*values) for values in rows]
    expected = _rows(dec, messages)
    for chunk in _chunks(messages):
        assert chunk.insert_runs(min_run=1) == [(0, len(messages), 16385)]
        after = insert_run_after(chunk, 0, len(messages), rel)
        assert after is not None
        assert _columns(after) == expected
        assert after.type == pa.map_(pa.string(), pa.string())


def test_booleans_are_printed_as_bool_text() -> None:
    dec, rel = _decoder([("id", 23, 1), ("ok", _BOOL, 0)])
    messages = [insert("1", "t"), insert("2", "f"), insert("3", None)]
    after = insert_run_after(PeekChunk.of_values(messages), 0, 3, rel)
    assert after is not None
    assert _columns(after) == [[("id", "1"), ("ok", "true")], [("id", "2"), ("ok", "false")], [("id", "3"), ("ok", None)]]
    assert _columns(after) == _rows(dec, messages)


def _declines(messages: list[bytes], cols: list[tuple[str, int, int]] | None = None) -> None:
    _dec, rel = _decoder(cols or [("id", 23, 1), ("v", _TEXT, 0)])
    for chunk in _chunks(messages[:1]):  # the good message alone is taken: the one after it is what declines
        assert insert_run_after(chunk, 0, 1, rel) is not None
    for chunk in _chunks(messages):
        assert insert_run_after(chunk, 0, len(messages), rel) is None


def test_binary_and_unchanged_values_go_row_by_row() -> None:
    _declines([insert("1", "a"), insert("2", ("b", b"\x00\x01"))])
    good = insert("1", "a")
    _declines([good, good[:-len(tup("1", "a"))] + tup("1", None)[:-1] + b"u"])


def test_a_column_count_unlike_the_relation_goes_row_by_row() -> None:
    _declines([insert("1", "a"), insert("2", "b", "c")])
    _declines([insert("1", "a"), insert("2")])


def test_malformed_messages_go_row_by_row() -> None:
    good = insert("1", "abc")
    _declines([good, good[:-1]])  # truncated: the last value runs past the message
    _declines([good, good + b"x"])  # trailing bytes
    _declines([good, good[:5] + b"O" + good[6:]])  # not 'N' after the relation id
    _declines([good, good[:-3] + b"\xff\xfe\xfd"])  # not UTF-8
    huge = good[: -len(tup("1", "abc"))] + struct.pack("!H", 2) + b"t" + struct.pack("!I", 2**31) + b"1"
    _declines([good, huge])


def test_runs_are_inserts_of_one_relation_long_enough() -> None:
    dec, _rel = _decoder([("id", 23, 1), ("v", _TEXT, 0)])
    dec.decode(relation(relid=7, cols=[("k", 23, 1)]))
    other = [insert(str(i), relid=7) for i in range(3)]
    first = [insert(str(i), "x") for i in range(20)]
    update = b"U" + struct.pack("!I", 16385) + b"N" + tup("1", "y")
    later = [insert(str(i), "z") for i in range(17)]
    messages = [b"B" + bytes(20), relation(), *first, *other, update, *later, b"I\x00"]
    chunk = PeekChunk.of_values(messages)
    assert chunk.insert_runs(min_run=16) == [(2, 22, 16385), (26, 43, 16385)]
    assert chunk.insert_runs(min_run=3) == [(2, 22, 16385), (22, 25, 7), (26, 43, 16385)]
    assert PeekChunk.of_values(messages[:5]).insert_runs(min_run=16) == []


def test_long_runs_are_decoded_in_pieces_of_bounded_size(monkeypatch: Any) -> None:
    from pgpoll.decode import pgoutput_columns

    monkeypatch.setattr(pgoutput_columns, "MAX_RUN_BYTES", 1000)
    dec, rel = _decoder([("id", 23, 1), ("v", _TEXT, 0)])
    messages = [insert(str(i), "x" * (i % 50)) for i in range(300)] + [insert("big", "y" * 5000)]
    chunk = PeekChunk.of_values(messages)
    runs = chunk.insert_runs(min_run=1)
    assert len(runs) > 10 and runs[0][0] == 0 and runs[-1] == (300, 301, 16385)  # a value over the limit: alone
    assert all(a == b for (_, a, _), (b, _, _) in itertools.pairwise(runs))  # contiguous
    assert all(int(chunk.ends[hi - 1] - chunk.starts[lo]) <= 1000 for lo, hi, _ in runs[:-1])
    decoded = []
    for lo, hi, _ in runs:
        after = insert_run_after(chunk, lo, hi, rel)
        assert after is not None
        decoded += _columns(after)
    assert decoded == _rows(dec, messages)
