"""test_decoding INSERT lines decoded column-wise give exactly the row path's values, or decline.

The reference is :class:`TestDecodingDecoder` one line at a time. Every
INSERT line of the corpus of real test_decoding output (PostgreSQL's own
regression suite) goes through both, repeated into a run; hand-made lines
set the traps: a separator's text inside a quoted value, doubled quotes,
bits, special numbers, ``null`` against ``'null'``, empty strings, another
column list or type mid-run, no tuple data, an unchanged-TOAST marker, and
text that is not UTF-8.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgpoll.changes import RowChange
from pgpoll.decode.decoders import TextRows
from pgpoll.decode.pgoutput_columns import PeekChunk
from pgpoll.decode.text_decoder import TestDecodingDecoder
from tests.decode.test_test_decoding_corpus import corpus  # noqa: F401 -- the fixture

_HEAD = "table public.t: INSERT:"


def _reference(lines: list[bytes]) -> list[list[tuple[str, Any]]]:
    dec = TestDecodingDecoder()
    out = []
    for line in lines:
        event = dec.decode(line.decode())
        assert isinstance(event, RowChange) and event.after is not None
        out.append(list(event.after.items()))
    return out


def _columnwise(lines: list[bytes]) -> tuple[int, list[list[tuple[str, Any]]]] | None:
    """Decode line 0 the row way, then the run after it column-wise: ``(end, after images)`` or ``None``."""
    rows = TextRows()
    rows(lines[0], 1, None)
    run = rows.text_run
    assert run is not None
    got = run(PeekChunk.of_values(lines), 0, len(lines))
    if got is None:
        return None
    end, after = got
    return end, [list(pairs) for pairs in after.to_pylist()]


def _line(*columns: str) -> bytes:
    return (_HEAD + "".join(" " + c for c in columns)).encode()


def test_values_equal_the_row_path() -> None:
    values = ["'plain'", "''", "'it''s'", "'null'", "null", "'☃ ünïcode'", "'a\\b'", "'x v[text] ''y'''",
              "'[x]'", "'line\nbreak'"]
    numbers = ["1", "-2.5", "1e10", "NaN", "-Infinity", "null", "+.5", "3.", "true", "B'0101'", "B''"]
    lines = [_line(f"n[numeric]:{numbers[i % len(numbers)]}", f"v[text]:{values[i % len(values)]}",
                   "\"odd name\"[character varying(3)]:'abc'") for i in range(40)]
    got = _columnwise(lines)
    assert got is not None
    end, after = got
    assert end == 40
    assert after == _reference(lines)[1:]


@pytest.mark.parametrize("trap", [
    _line("n[numeric]:1", "v[text]:'a' extra[text]:'b'"),  # another column list
    _line("n[bigint]:1", "v[text]:'a'"),  # another type
    _line("n[numeric]:1", "v[text]:'a' v[text]:'b'"),
    _line("n[numeric]:1", "v[text]:unchanged-toast-datum"),
    _line("n[numeric]:1", "v[text]:'unterminated"),
    _line("n[numeric]:1 2", "v[text]:'a'"),
    _line("n[numeric]:1", "v[text]:'a'") + b"\xff",
    _line("n[numeric]:1", "v[text]:'x v[text]:''y'''"),  # a separator's text inside a value
    _line("n[numeric]:1", "v[text]:'x v[text]:y'"),
    _line("n[numeric]:1", "v[text]:'a'' v[text]:'''"),
    _line("n[numeric]:1", "v[text]:'a]:b'"),
    (_HEAD + " (no-tuple-data)").encode(),
])
def test_a_line_unlike_the_first_declines_the_run(trap: bytes) -> None:
    good = [_line("n[numeric]:1", "v[text]:'a'")] * 30
    assert _columnwise([*good[:20], trap, *good[20:]]) is None


def test_runs_end_where_the_prefix_changes_and_are_long_enough() -> None:
    first = [_line("n[numeric]:1", "v[text]:'a'")] * 20
    other = [b"table public.u: INSERT: n[numeric]:1 v[text]:'a'"] * 20
    got = _columnwise([*first, *other])
    assert got is not None and got[0] == 20
    assert _columnwise([*first[:10], *other]) is None  # 9 lines after the first: row by row


def test_every_corpus_insert_line_decodes_alike(corpus: list[dict[str, Any]]) -> None:  # noqa: F811 -- the fixture
    inserts = [r["line"].encode() for r in corpus
               if r["line"].startswith("table ") and ": INSERT: " in r["line"] and "(no-tuple-data)" not in r["line"]]
    assert len(inserts) > 100
    taken = 0
    for line in inserts:
        got = _columnwise([line] * 20)
        expected = _reference([line])[0]
        if got is not None:
            taken += 1
            assert got[0] == 20 and got[1] == [expected] * 19, line[:120]
        else:  # declined: only where the row path's values hold something the column path does not take
            assert b"unchanged-toast-datum" in line or b": INSERT:" in line.split(b": INSERT:", 1)[1], line[:120]
    assert taken >= len(inserts) * 0.9
