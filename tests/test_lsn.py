"""``Lsn``: parses and prints PostgreSQL's form, orders, converts, pickles, refuses bad text."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn, lsn_or_none

lsns = st.integers(min_value=0, max_value=(1 << 64) - 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [("0/0", 0), ("0/16B1970", 0x16B1970), ("16/B374D848", (0x16 << 32) | 0xB374D848), ("1/0", 1 << 32),
     ("FFFFFFFF/FFFFFFFF", (1 << 64) - 1), ("0/16b1970", 0x16B1970), (" 0/1 ", 1), ("00000016B374D848", 0x16B374D848)],
)
def test_parse(text: str, value: int) -> None:
    assert int(Lsn.parse(text)) == value
    assert Lsn(text) == value


@pytest.mark.parametrize("value", [0, 1, 0x16B1970, 1 << 32, (1 << 64) - 1])
def test_prints_like_postgresql(value: int) -> None:
    high, low = value >> 32, value & 0xFFFFFFFF
    assert str(Lsn(value)) == f"{high:X}/{low:X}"
    assert repr(Lsn(value)) == f"Lsn('{high:X}/{low:X}')"


def test_padded_form_sorts_as_text() -> None:
    values = [Lsn.parse(t) for t in ("0/FF", "0/100", "1/0", "A/0", "10/0")]
    assert sorted(v.padded() for v in values) == [v.padded() for v in sorted(values)]
    assert Lsn.parse("16/B374D848").padded() == "00000016B374D848"


@pytest.mark.parametrize(
    "text", ["", "zzz", "0/G", "1/2/3", "-1/0", "123456789/0", "0/123456789", "0x10", "1/", "/1", "0/16B1970x"]
)
def test_parse_refuses_bad_text(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Lsn.parse(text)
    assert caught.value.message == f"{text.strip()!r} is not an LSN"
    assert caught.value.hint == "write it as PostgreSQL prints it, e.g. 0/16B1970"


@pytest.mark.parametrize("value", [-1, 1 << 64])
def test_out_of_range_ints_are_refused(value: int) -> None:
    with pytest.raises(ConfigError):
        Lsn(value)


@given(lsns)
def test_text_round_trip(value: int) -> None:
    lsn = Lsn(value)
    assert Lsn.parse(str(lsn)) == lsn
    assert Lsn.parse(lsn.padded()) == lsn


@given(lsns, lsns)
def test_orders_like_ints(a: int, b: int) -> None:
    assert (Lsn(a) < Lsn(b)) == (a < b)
    assert (Lsn(a) == Lsn(b)) == (a == b)


def test_pickles_and_hashes_as_its_value() -> None:
    lsn = Lsn.parse("16/B374D848")
    again = pickle.loads(pickle.dumps(lsn))
    assert type(again) is Lsn and again == lsn
    assert {lsn: 1}[Lsn(int(lsn))] == 1


def test_lsn_or_none() -> None:
    assert lsn_or_none(None) is None
    assert lsn_or_none("0/10") == Lsn(16)
    assert lsn_or_none(16) == Lsn(16)


def test_matches_the_server(db: object) -> None:
    rows = db.execute(  # type: ignore[attr-defined]
        "SELECT v::text, pg_wal_lsn_diff(v, '0/0')::numeric::text FROM "
        "(VALUES ('0/0'::pg_lsn), ('16/B374D848'), ('FFFFFFFF/FFFFFFFF'), (pg_current_wal_lsn())) AS s(v)"
    )
    for text, value in rows:
        assert str(Lsn(int(value))) == text
