"""Slot-name rules, identifier checks, and parsing of ``schema.table (cols)`` like PostgreSQL's lexer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgpoll.errors import ConfigError
from pgpoll.source.names import (
    QualifiedName,
    check_identifier,
    check_slot_name,
    fold_case,
    parse_column_list,
    parse_qualified_name,
    quote_ident,
)


@pytest.mark.parametrize("name", ["a", "slot_1", "0lead", "_", "x" * 63])
def test_check_slot_name_accepts_postgresql_names(name: str) -> None:
    assert check_slot_name(name) == name


@pytest.mark.parametrize(
    ("name", "message", "hint"),
    [
        ("", "slot name is empty", "lower-case letters, digits and underscores"),
        ("A", "slot name 'A' is not allowed", "only lower-case letters, digits and underscores"),
        ("a-b", "slot name 'a-b' is not allowed", "only lower-case letters, digits and underscores"),
        ("a.b", "slot name 'a.b' is not allowed", "only lower-case letters, digits and underscores"),
        ("é", "slot name 'é' is not allowed", "only lower-case letters, digits and underscores"),
        ("x" * 64, "is longer than 63 bytes", "at most 63 lower-case letters"),
    ],
)
def test_check_slot_name_refuses_with_the_rule(name: str, message: str, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_slot_name(name)
    assert message in caught.value.message
    assert hint in (caught.value.hint or "")


def test_check_identifier_refuses_empty_nul_and_long_names() -> None:
    for bad in ("", "a\x00b", "é" * 32):
        with pytest.raises(ConfigError):
            check_identifier(bad, "table")
    assert check_identifier("é" * 31 + "x", "table") == "é" * 31 + "x"  # 63 bytes


def test_fold_case_lowers_ascii_only() -> None:
    assert fold_case("ÄBC_Ñandú$1") == "Äbc_Ñandú$1"


@pytest.mark.parametrize(
    ("text", "name", "rest"),
    [
        ("orders", QualifiedName("public", "orders"), ""),
        ("Sales.Orders", QualifiedName("sales", "orders"), ""),
        ('"Sales"."Or ders" (a)', QualifiedName("Sales", "Or ders"), " (a)"),
        ('"a""b"."c.d;e"', QualifiedName('a"b', "c.d;e"), ""),
        ("  ÄBC WHERE (x)", QualifiedName("public", "Äbc"), " WHERE (x)"),
        ("t$1", QualifiedName("public", "t$1"), ""),
        ("t;", QualifiedName("public", "t"), ";"),
    ],
)
def test_parse_qualified_name(text: str, name: QualifiedName, rest: str) -> None:
    parsed, pos = parse_qualified_name(text)
    assert parsed == name
    assert text[pos:] == rest


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"open', "unterminated quoted name"),
        ("1abc", "expected a name at position 0"),
        ("s.", "expected a name at position 2"),
        ("-- x", "expected a name at position 0"),
        ('""', "is empty"),
    ],
)
def test_parse_qualified_name_refuses(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_qualified_name(text)
    assert message in caught.value.message


def test_parse_column_list() -> None:
    cols, pos = parse_column_list('(a, "B c", "x""y" ,Ü) WHERE', 0)
    assert cols == ["a", "B c", 'x"y', "Ü"]
    assert pos == len('(a, "B c", "x""y" ,Ü)')
    for bad, message in [("(a b)", "unexpected 'b'"), ("(a,", "expected a name"), ("(a", "unclosed column list"),
                         ("a)", "expected '('")]:
        with pytest.raises(ConfigError) as caught:
            parse_column_list(bad, 0)
        assert message in caught.value.message


@pytest.mark.parametrize(("name", "quoted"), [("abc", "abc"), ("a_1", "a_1"), ("Abc", '"Abc"'), ("a b", '"a b"'),
                                              ('a"b', '"a""b"'), ("1a", '"1a"'), ("a$", '"a$"'), ("é", '"é"')])
def test_quote_ident_quotes_like_postgresql(name: str, quoted: str) -> None:
    assert quote_ident(name) == quoted


names = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), min_size=1).filter(
    lambda s: len(s.encode()) < 64
)


@given(schema=names, table=names)
def test_quoted_names_round_trip_through_the_parser(schema: str, table: str) -> None:
    parsed, pos = parse_qualified_name(str(QualifiedName(schema, table)))
    assert parsed == QualifiedName(schema, table)
    assert pos == len(str(QualifiedName(schema, table)))


@given(cols=st.lists(names, min_size=1, max_size=5))
def test_quoted_column_lists_round_trip(cols: list[str]) -> None:
    text = "(" + ", ".join(quote_ident(c) for c in cols) + ")"
    assert parse_column_list(text, 0) == (cols, len(text))
