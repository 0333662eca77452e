"""Typed-table directory names: any schema and table name maps to one safe directory and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgpoll.sink.layout import parse_table_dir_name, table_dir_name

HOSTILE = [
    ("public", "t"),
    ("public", "we.ird"),
    ("My Schema", "we.ird/t[1]"),
    ("a.b", "c.d.e"),
    ("s", "../../etc/passwd"),  # checkout-paths: data (a hostile name)
    ("s", "100%"),
    ("s", "%41"),  # looks escaped already
    ("s", "with space"),
    ("s", 'say "hi"'),
    ("s", "it's"),
    ("s", "*"),
    ("s", "a?b"),
    ("s", "[abc]"),
    ("s", "{a,b}"),
    ("s", "back\\slash"),
    ("s", "lsn_range=0-1"),
    ("sch\u00e9ma", "t\u00e4ble"),
    ("\u65e5\u672c", "\U0001f600"),
    ("public", "_hidden"),
    ("public", ".dot"),
    ("public", "-dash"),
    ("public", "CamelCase"),
    ("s", "tab\tnew\nline"),
]


def _assert_safe(name: str) -> None:
    assert "/" not in name and "\\" not in name
    assert name.count(".") == 1
    assert not name.startswith((".", "_")), name  # Spark and Hadoop skip such names as hidden
    assert all(ch.isascii() and (ch.isalnum() or ch in "_-.%") for ch in name), name
    assert not any(ch in name for ch in "*?[]{}"), name


@pytest.mark.parametrize(("schema", "table"), HOSTILE)
def test_hostile_names_round_trip_to_one_safe_directory(schema: str, table: str) -> None:
    name = table_dir_name(schema, table)
    _assert_safe(name)
    assert parse_table_dir_name(name) == (schema, table)


def test_plain_names_stay_readable() -> None:
    assert table_dir_name("public", "orders") == "public.orders"
    assert table_dir_name("My Schema", "we.ird/t[1]") == "My%20Schema.we%2Eird%2Ft%5B1%5D"


def test_distinct_names_give_distinct_directories() -> None:
    names = [table_dir_name(s, t) for s, t in HOSTILE] + [table_dir_name("a", "b.c"), table_dir_name("a.b", "c")]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("schema", ["_private", ".dot", "__x"])
def test_a_leading_underscore_or_dot_in_the_schema_part_round_trips(schema: str) -> None:
    name = table_dir_name(schema, "t")
    _assert_safe(name)
    assert parse_table_dir_name(name) == (schema, "t")


@pytest.mark.parametrize("name", ["_pgpoll", ".hidden.t", "no_dot", "a.b.c", "_x.t", "lsn_range=0-1"])
def test_names_table_dir_name_never_makes_are_not_tables(name: str) -> None:
    assert parse_table_dir_name(name) is None


_NAME = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=63)


@given(_NAME, _NAME)
def test_any_name_round_trips(schema: str, table: str) -> None:
    name = table_dir_name(schema, table)
    _assert_safe(name)
    assert parse_table_dir_name(name) == (schema, table)
