"""Parsing ``--row-filter`` specs: the accepted forms, and every refused form raises ConfigError."""

from __future__ import annotations

import pytest

from pgpoll.errors import ConfigError
from pgpoll.rowfilter.expression import (
    Between,
    BoolOp,
    BoolTest,
    ColumnRef,
    Compare,
    Const,
    Distinct,
    InList,
    Not,
    NullTest,
    parse_row_filter,
)


def test_table_names_plain_quoted_and_default_schema() -> None:
    f = parse_row_filter("Orders: (id > 5)")
    assert (f.schema, f.table) == ("public", "orders")
    f = parse_row_filter('"My Schema"."T 1": ("Col" > 5)')
    assert (f.schema, f.table, f.columns()) == ("My Schema", "T 1", frozenset({"Col"}))
    f = parse_row_filter('"we""ird".x: ("a:b" = \'c\')')
    assert (f.schema, f.table, f.columns()) == ('we"ird', "x", frozenset({"a:b"}))
    assert f.text == "(\"a:b\" = 'c')"


def test_expression_tree_and_precedence() -> None:
    f = parse_row_filter("s.t: (a = 1 OR b <> 2 AND NOT c < -3)")
    assert f.expression == BoolOp("OR", (
        Compare("=", ColumnRef("a"), Const("int", "1")),
        BoolOp("AND", (Compare("<>", ColumnRef("b"), Const("int", "2")),
                       Not(Compare("<", ColumnRef("c"), Const("int", "-3"))))),
    ))
    assert parse_row_filter("t: (a != 1.5e2)").expression == Compare("<>", ColumnRef("a"), Const("numeric", "1.5e2"))
    assert parse_row_filter("t: (a>=-5)").expression == Compare(">=", ColumnRef("a"), Const("int", "-5"))


def test_predicates() -> None:
    e = parse_row_filter("t: (a IS NOT NULL AND b ISNULL AND c IS NOT TRUE AND d IS UNKNOWN)").expression
    assert e == BoolOp("AND", (NullTest(ColumnRef("a"), True), NullTest(ColumnRef("b"), False),
                               BoolTest(ColumnRef("c"), True, True), BoolTest(ColumnRef("d"), None, False)))
    e = parse_row_filter("t: (a NOT IN (1, 'x', NULL) OR b BETWEEN 1 AND 2 OR c IS DISTINCT FROM TRUE)").expression
    assert e == BoolOp("OR", (
        InList(ColumnRef("a"), (Const("int", "1"), Const("string", "x"), Const("null", None)), True),
        Between(ColumnRef("b"), Const("int", "1"), Const("int", "2"), False),
        Distinct(ColumnRef("c"), Const("bool", "true"), False),
    ))


def test_strings_and_casts() -> None:
    e = parse_row_filter("t: (a = 'it''s' AND d >= '2024-01-01'::date AND x = '1'::double precision)").expression
    assert isinstance(e, BoolOp)
    assert e.args[0] == Compare("=", ColumnRef("a"), Const("string", "it's"))
    assert e.args[1] == Compare(">=", ColumnRef("d"), Const("string", "2024-01-01", "date"))
    assert e.args[2] == Compare("=", ColumnRef("x"), Const("string", "1", "double precision"))


REFUSED = [
    ("t: (a > 5); DROP TABLE x", "';'"),
    ("t: (a > 5; DROP TABLE x)", "';'"),
    ("t: (a > 5) -- c", "comments"),
    ("t: (a > 5 /* c */)", "comments"),
    ("t: (a = $$x$$)", "'$'"),
    ("t: (a = $1)", "'$'"),
    ("t: (a = E'x')", "prefixed string"),
    ("t: (a = U&'x')", "U&"),
    ("t: (a = 'x\\y')", "backslash"),
    ("t: (a = x'1f')", "prefixed string"),
    ("t: (lower(a) = 'x')", "function call"),
    ("t: (a = now())", "function call"),
    ("t: ((SELECT 1) = 1)", "subqueries"),
    ("t: (a IN (SELECT b FROM c))", "subqueries"),
    ("t: (EXISTS (SELECT 1))", "subqueries"),
    ("t: (a || b = 'x')", "'||'"),
    ("t: (a + 1 > 2)", "'+'"),
    ("t: (a LIKE 'x%')", "LIKE"),
    ("t: (a ~ 'x')", "'~'"),
    ("t: (a @> b)", "'@>'"),
    ("t: (xmin = 1)", "system column"),
    ("t: (ctid = '(0,1)')", "system column"),
    ("t: (t.a = 1)", "qualified"),
    ("t: (a::text = 'x')", "constants only"),
    ("t: (a = '1'::numeric(3,1))", "cast"),
    ("t: (a = '1'::pg_catalog.int4)", "cast"),
    ("t: (a = '1'::money)", "cast"),
    ("t: (CASE WHEN a THEN b END)", "CASE"),
    ("t: (CAST(a AS int) = 1)", "CAST"),
    ("t: (ARRAY[1] = a)", "ARRAY"),
    ("t: (1 < a < 2)", "chained"),
    ("t: (a = 0x1F)", "trailing junk"),
    ("t: (a = 1_000)", "trailing junk"),
    ("t: (a BETWEEN SYMMETRIC 1 AND 2)", "SYMMETRIC"),
    ("t: (a IS OF (int))", "IS OF"),
    ("t: a > 1", "parentheses"),
    ("t: (a > 1) OR (b > 2)", "after the parenthesised"),
    ("t: ()", "empty"),
    ("t (a > 1)", "':'"),
    ("a.b.c: (a > 1)", "':'"),
    (": (a > 1)", "':'"),
    ('"": (a > 1)', "zero-length"),
    ("t: (\"\" = 1)", "zero-length"),
    ("t: (a = 'x)", "unterminated"),
    ("t: (\"a = 1)", "unterminated"),
    ("t: (a = 1", "expected ')'"),
    ("t: (a = 1))", "unexpected"),
    ("t: (a = 1\x00)", "NUL"),
    ("t: (a[1] = 2)", "'['"),
    ("t: (select = 1)", "subqueries"),
    ("t: (from = 1)", "FROM"),
    ("t: (a = ?)", "'?'"),
]


@pytest.mark.parametrize("spec,needle", REFUSED)
def test_refused_forms_raise_config_error_naming_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_row_filter(spec)
    assert needle.lower() in str(info.value).lower()
    assert info.value.hint  # every refusal says how to fix it
    assert len(str(info.value).splitlines()) <= 2


def test_quoted_reserved_word_is_a_column() -> None:
    assert parse_row_filter('t: ("from" = 1)').columns() == frozenset({"from"})


def test_not_text() -> None:
    with pytest.raises(ConfigError):
        parse_row_filter(42)  # type: ignore[arg-type]


def test_error_is_exit_2() -> None:
    from pgpoll.cli.exitcodes import exit_code_for

    assert exit_code_for(ConfigError("x")) == 2
