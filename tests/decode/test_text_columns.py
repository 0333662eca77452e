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

import random
from typing import Any

import pytest

from pgpoll.changes import RowChange
from pgpoll.decode import text_columns
from pgpoll.decode.decoders import TextRows
from pgpoll.decode.pgoutput_columns import MIN_RUN, PeekChunk
from pgpoll.decode.text_decoder import TestDecodingDecoder
from pgpoll.errors import DecodeError
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


def _random_token(rng: random.Random, quoted: bool, odd: float) -> str:
    """A value as test_decoding prints it: plain (numbers, quoted text without quotes), or with odds ``odd`` not."""
    if quoted:
        alphabet = "ab -.:][☃\\0," + ("'" if rng.random() < odd else "")
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))).replace("]:", "]x")  # (see below)
        return "'" + text.replace("'", "''") + "'" if rng.random() >= odd else rng.choice(["null", "'null'"])
    if rng.random() >= odd:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 6)))
        cut = rng.randrange(0, len(digits) + 1)
        return rng.choice(["", "-"]) + (digits[:cut] + "." + digits[cut:] if rng.random() < 0.5 else digits)
    return rng.choice(["null", "NaN", "-Infinity", "1e5", "+1", "true", "B'01'", "-", ".", "1.2.3", "--1", "1-", "-."])


@pytest.mark.parametrize("seed", range(60))
def test_random_values_equal_the_row_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random runs of values: the column path gives the row path's values, or declines where the row path refuses a
    line; a run of plain values (even seeds) is cut without the general unquoting."""
    rng = random.Random(seed)
    plain = seed % 2 == 0
    if plain:
        monkeypatch.setattr(text_columns, "_value", lambda tokens: pytest.fail("the general path ran"))
    odd = 0.0 if plain else 0.0002  # per line after the first: about 1% at line 50
    n = rng.randrange(MIN_RUN + 2, 80)  # (a shorter run goes row by row)
    lines = [_line(f"n[numeric]:{_random_token(rng, False, odd * i)}", f"v[text]:{_random_token(rng, True, odd * i)}",
                   f"m[bigint]:{_random_token(rng, False, odd * i)}") for i in range(n)]  # (the row path takes line 0)
    got = _columnwise(lines)
    try:
        reference = _reference(lines)
    except DecodeError:  # a line the row path refuses: the column path must not take the run
        assert got is None
        return
    assert got is not None or not plain  # (a value holding "]:" declines a run: test_values_equal_the_row_path)
    assert got is None or (got[0] == n and got[1] == reference[1:])


def test_plain_values_are_cut_without_unquoting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numbers and quoted text without quotes are sliced out as they are: the general unquoting is not run."""
    monkeypatch.setattr(text_columns, "_value", lambda tokens: pytest.fail("the general path ran"))
    lines = [_line(f"n[numeric]:{-i}.5", f"v[text]:'name-{i} 12:00:00+00 a]b'", f"m[bigint]:{i * 7}")
             for i in range(30)]
    got = _columnwise(lines)
    assert got is not None and got[0] == 30 and got[1] == _reference(lines)[1:]
