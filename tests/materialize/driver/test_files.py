"""Choosing a large Delta state's files by key in the driver: the same files the Spark join chooses."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgpoll.materialize.delta.table import DataFile
from pgpoll.materialize.driver import files as driver_files
from pgpoll.materialize.driver.files import comparable_key, touched_files


def _file(path: str, lo: tuple[int | str, ...], hi: tuple[int | str, ...], *, records: int = 10,
          nulls: int = 0) -> DataFile:
    key = [f"k{i}" for i in range(len(lo))]
    return DataFile(path, 100, records, dict(zip(key, lo, strict=True)), dict(zip(key, hi, strict=True)),
                    {k: nulls for k in key})


def test_a_key_in_a_files_range_touches_it_and_keys_between_files_touch_none() -> None:
    files = [_file("a", (1,), (100,)), _file("b", (101,), (200,)), _file("c", (300,), (400,))]
    assert touched_files(files, ["k0"], {(100,), (250,), (401,)}) == {"a"}
    assert touched_files(files, ["k0"], {(101,), (300,), (None,)}) == {"b", "c"}
    assert touched_files(files, ["k0"], set()) == set()


def test_empty_files_and_files_with_a_null_key_are_always_rewritten() -> None:
    files = [_file("empty", (1,), (1,), records=0), _file("nulls", (5,), (9,), nulls=1), _file("ok", (10,), (20,))]
    assert touched_files(files, ["k0"], {(15,)}) == {"empty", "nulls", "ok"}
    assert touched_files(files, ["k0"], {(99,)}) == {"empty", "nulls"}


def test_composite_keys_must_lie_in_every_columns_range_and_strings_compare_by_code_point() -> None:
    files = [_file("a", (1, "a"), (5, "m")), _file("b", (1, "n"), (5, "z")), _file("c", (6, "a"), (9, "é"))]
    assert touched_files(files, ["k0", "k1"], {(3, "q")}) == {"b"}
    assert touched_files(files, ["k0", "k1"], {(7, "zz")}) == {"c"}  # "zz" < "é"
    assert touched_files(files, ["k0", "k1"], {(3, None), (None, "b")}) == set()


def test_too_many_comparisons_for_a_composite_key_leave_the_choice_to_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [_file(str(i), (i, "a"), (i, "z")) for i in range(3)]
    monkeypatch.setattr(driver_files, "MAX_COMPARISONS", 5)
    assert driver_files.touched_files(files, ["k0", "k1"], {(1, "b"), (2, "c")}) is None
    monkeypatch.setattr(driver_files, "MAX_COMPARISONS", 6)
    assert driver_files.touched_files(files, ["k0", "k1"], {(1, "b"), (2, "c")}) == {"1", "2"}


def test_the_key_types_compared_in_python() -> None:
    schema = pa.schema([("i", pa.int64()), ("s", pa.string()), ("d", pa.date32()), ("f", pa.float64())])
    assert comparable_key(schema, ["i", "s"]) and not comparable_key(schema, ["d"]) and not comparable_key(schema, ["f"])
