"""--tables / --exclude-tables: shell patterns over schema.table or the bare table name."""

from __future__ import annotations

import pickle

from pgpoll.table_patterns import TablePatterns


def test_no_patterns_take_every_table_and_changes_without_a_table() -> None:
    assert TablePatterns().accepts("public", "t")
    assert TablePatterns(("public.a",)).accepts(None, None)


def test_include_matches_qualified_or_bare_names() -> None:
    patterns = TablePatterns(("public.ord*", "items"))
    assert patterns.accepts("public", "orders")
    assert patterns.accepts("shop", "items")
    assert not patterns.accepts("shop", "orders")


def test_exclude_wins_over_include_and_is_case_sensitive() -> None:
    patterns = TablePatterns(("public.*",), ("public.tmp_*",))
    assert patterns.accepts("public", "orders")
    assert not patterns.accepts("public", "tmp_x")
    assert TablePatterns((), ("Public.*",)).accepts("public", "t")


def test_patterns_pickle_for_spark_executors() -> None:
    patterns = TablePatterns(("a.*",), ("a.b",))
    assert pickle.loads(pickle.dumps(patterns)) == patterns
