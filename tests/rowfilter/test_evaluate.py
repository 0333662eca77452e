"""Evaluating row filters on text values: types, NULLs, three-valued logic, the UPDATE transformation."""

from __future__ import annotations

import pytest

from pgpoll.errors import ConfigError
from pgpoll.rowfilter import TableFilters, parse_row_filter
from pgpoll.rowfilter.evaluate import compile_filter

TYPES = {
    "id": "integer", "big": "bigint", "n": "numeric(10,2)", "f": "real", "d8": "double precision",
    "s": "text", "v": "character varying(20)", "c": "character(5)", "b": "boolean", "d": "date",
    "ts": "timestamp without time zone", "tz": "timestamp with time zone", "u": "uuid", "j": "jsonb",
    "arr": "integer[]",
}


def ev(expr: str, **row: str | None) -> bool | None:
    return compile_filter(parse_row_filter(f"t: {expr}"), TYPES)(row)


def test_integers_compare_as_numbers_not_text() -> None:
    assert ev("(id > 9)", id="10") is True
    assert ev("(id > '9')", id="10") is True  # the string constant takes the column's type
    assert ev("(id < 9.5)", id="10") is False
    assert ev("(big = 9223372036854775807)", big="9223372036854775807") is True
    assert ev("(id = 99999999999999999999)", id="1") is False  # numeric constant: compared as numeric


def test_numeric_and_float_nan_and_rounding() -> None:
    assert ev("(n = 1.50)", n="1.5") is True
    assert ev("(n > 1000000)", n="NaN") is True  # NaN sorts above everything
    assert ev("(n = 'NaN')", n="NaN") is True  # and equals NaN
    assert ev("(n < 'Infinity')", n="NaN") is False
    assert ev("(d8 > 0)", d8="NaN") is True
    assert ev("(d8 = 'Infinity')", d8="Infinity") is True
    # real = 0.1 compares as float8 (float48eq): the stored single-precision value is not 0.1
    assert ev("(f = 0.1)", f="0.1") is False
    assert ev("(f = '0.1')", f="0.1") is True  # a string constant becomes real
    assert ev("(f = 0.5)", f="0.5") is True


def test_text_bpchar_and_boolean() -> None:
    assert ev("(s = 'x')", s="x") is True
    assert ev("(s < 'b')", s="a") is True
    assert ev("(v = 'hello')", v="hello") is True
    assert ev("(c = 'ab')", c="ab   ") is True  # character(n) ignores trailing spaces
    assert ev("(b)", b="true") is True
    assert ev("(b = 'yes')", b="true") is True
    assert ev("(b = FALSE)", b="true") is False
    assert ev("(b > FALSE)", b="true") is True


def test_dates_and_timestamps() -> None:
    assert ev("(d >= '2024-01-01')", d="2024-01-01") is True
    assert ev("(d > '2024-01-01'::date)", d="0044-03-15 BC") is False
    assert ev("(d < 'infinity')", d="9999-12-31") is True
    assert ev("(ts > '2024-01-01 10:00')", ts="2024-01-01 10:00:00.000001") is True
    assert ev("(tz = '2024-01-01 01:00:00+01')", tz="2024-01-01 00:00:00+00") is True
    assert ev("(tz = '2024-01-01T00:00:00Z')", tz="2024-01-01 00:00:00+00") is True
    assert ev("(tz > '2024-01-01')", tz="2024-01-01 00:00:01+00") is True  # no offset: UTC


def test_other_types_exact_text_equality_only() -> None:
    u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert ev(f"(u = '{u}')", u=u) is True
    assert ev(f"(u <> '{u}')", u=u) is False
    assert ev("(j IN ('{\"a\": 1}', '[]'))", j="[]") is True
    with pytest.raises(ConfigError, match="ordering"):
        ev("(u > 'a')", u=u)


def test_three_valued_logic() -> None:
    assert ev("(id > 1)", id=None) is None
    assert ev("(id > 1)") is None  # a column absent from the row is NULL
    assert ev("(id > 1 AND s = 'x')", id=None, s="y") is False
    assert ev("(id > 1 AND s = 'x')", id=None, s="x") is None
    assert ev("(id > 1 OR s = 'x')", id=None, s="x") is True
    assert ev("(id > 1 OR s = 'x')", id=None, s="y") is None
    assert ev("(NOT id > 1)", id=None) is None
    assert ev("(id = NULL)", id=None) is None
    assert ev("(id IS NULL)", id=None) is True
    assert ev("(id NOTNULL)", id="1") is True
    assert ev("((id > 1) IS UNKNOWN)", id=None) is True
    assert ev("(b IS NOT TRUE)", b=None) is True
    assert ev("(b IS FALSE)", b=None) is False
    assert ev("(id IN (1, NULL))", id="2") is None
    assert ev("(id IN (1, NULL))", id="1") is True
    assert ev("(id NOT IN (1, NULL))", id="2") is None
    assert ev("(id NOT IN (1, 3))", id="2") is True
    assert ev("(id BETWEEN 1 AND 3)", id="3") is True
    assert ev("(id NOT BETWEEN 1 AND 3)", id="4") is True
    assert ev("(id BETWEEN NULL AND 3)", id="4") is False  # id <= 3 is false
    assert ev("(id IS DISTINCT FROM NULL)", id=None) is False
    assert ev("(id IS NOT DISTINCT FROM 2)", id="2") is True
    assert ev("(id IS DISTINCT FROM 2)", id=None) is True
    assert ev("(NULL)") is None
    assert ev("(TRUE)") is True


@pytest.mark.parametrize("expr,needle", [
    ("(s > 5)", "cannot compare"),
    ("(s = id)", "cannot compare"),
    ("(id = 'x')", "not a valid integer"),
    ("(id = '3000000000')", "not a valid integer"),
    ("(d = '2024-02-30')", "not a valid date"),
    ("(d = 'today')", "not a valid date"),
    ("(ts = '2024-01-01 10:00+02')", "not a valid timestamp"),
    ("(b = 'maybe')", "not a valid boolean"),
    ("(id)", "not a boolean"),
    ("('x')", "not a boolean"),
    ("(d = '2024-01-01'::timestamp)", "cannot compare"),
    ("(arr = '{1}' AND arr < '{2}')", "ordering"),
])
def test_type_errors_are_config_errors(expr: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ev(expr)


# ---- TableFilters.transform ----------------------------------------------------------

FILTERS = TableFilters([parse_row_filter("public.t: (id > 10)"), parse_row_filter("t: (s = 'keep')")])
T_TYPES = {"id": "integer", "s": "text", "big": "text"}


def tr(op: str, before: dict[str, str | None] | None, after: dict[str, str | None] | None) -> object:
    return FILTERS.transform(op, "public", "t", before, after, T_TYPES)


def test_insert_and_delete() -> None:
    assert tr("I", None, {"id": "11", "s": "x"}) == ("I", None, {"id": "11", "s": "x"})
    assert tr("I", None, {"id": "9", "s": "x"}) is None
    assert tr("I", None, {"id": "9", "s": "keep"}) == ("I", None, {"id": "9", "s": "keep"})  # ORed
    assert tr("I", None, {"id": None, "s": None}) is None  # NULL is no match
    assert tr("D", {"id": "11"}, None) == ("D", {"id": "11"}, None)
    assert tr("D", {"id": "1"}, None) is None
    assert tr("D", None, None) is None  # no old row: pgoutput does not send the DELETE


def test_update_transformations() -> None:
    old_in, old_out = {"id": "20", "s": "x"}, {"id": "5", "s": "x"}
    new_in, new_out = {"id": "21", "s": "x"}, {"id": "6", "s": "x"}
    assert tr("U", old_in, new_in) == ("U", old_in, new_in)
    assert tr("U", old_in, new_out) == ("D", old_in, None)
    assert tr("U", old_out, new_in) == ("I", None, new_in)
    assert tr("U", old_out, new_out) is None
    # no old row (key unchanged): the new row decides, as pgoutput does
    assert tr("U", None, new_in) == ("U", None, new_in)
    assert tr("U", None, new_out) is None


def test_update_to_insert_fills_unchanged_toast_from_the_old_row() -> None:
    old = {"id": "5", "s": "keep", "big": "x" * 10}
    new = {"id": "5", "s": "keep"}  # big: unchanged TOAST, absent
    assert tr("U", {**old, "s": "no"}, new) == ("I", None, {**new, "big": "x" * 10})
    assert tr("U", old, new) == ("U", old, new)


def test_truncate_and_unfiltered_tables_pass_through() -> None:
    assert tr("T", None, None) == ("T", None, None)
    assert FILTERS.transform("I", "public", "other", None, {"id": "1"}, {"id": "integer"}) == (
        "I", None, {"id": "1"})
    assert FILTERS.applies_to("public", "t") and not FILTERS.applies_to("s", "t")


def test_check_types_raises_at_start_up() -> None:
    filters = TableFilters([parse_row_filter("t: (id = 'abc')")])
    with pytest.raises(ConfigError, match="not a valid integer"):
        filters.check_types("public", "t", {"id": "integer"})
