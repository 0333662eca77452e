"""--typed-tables and materialize with a hostile table name and column names, on both plugins.

``"My Schema"."we.ird/t[1]"`` has a space, a dot, a slash and glob brackets;
its columns include ``"_op"`` (a meta column's name) and ``"A"`` beside
``"a"`` (equal ignoring case, which Spark compares by default).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pgpoll.sink import layout
from tests.ingest.conftest import capture_args, ingest
from tests.materialize.conftest import materialize

SCHEMA, TABLE = "My Schema", "we.ird/t[1]"
QUALIFIED = '"My Schema"."we.ird/t[1]"'
COLUMNS = ("id", "_op", "A", "a", "n")
STATE_META = ("_untyped", "_commit_lsn", "_commit_ts")


def _setup(db: Any, plugin: str) -> list[str]:
    db.require_plugin(plugin)
    db.execute('CREATE SCHEMA "My Schema"')
    db.execute(f'CREATE TABLE {QUALIFIED} (id int PRIMARY KEY, "_op" text, "A" int, "a" text, n numeric(6,2))')
    return capture_args(db, plugin, QUALIFIED)


def _source(db: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in db.execute(f'SELECT id, "_op", "A", "a", n FROM {QUALIFIED} ORDER BY id')]


def _state(out: str) -> list[tuple[Any, ...]]:
    """The materialized rows, read with pyarrow (which compares column names exactly)."""
    table = pq.read_table(str(Path(out) / layout.STATE / layout.table_dir_name(SCHEMA, TABLE)))
    assert sorted(table.column_names) == sorted(COLUMNS + STATE_META)
    return sorted(tuple(r[c] for c in COLUMNS) for r in table.to_pylist())


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_hostile_names_ingest_and_materialize(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    args = _setup(db, plugin)
    out = str(tmp_path / "out")
    db.execute(f"INSERT INTO {QUALIFIED} VALUES (1, 'x', 10, 'ten', 1.5), (2, 'y', 20, 'twenty', NULL), "
               f"(3, NULL, NULL, NULL, 'NaN')")
    db.execute(f'UPDATE {QUALIFIED} SET "_op" = \'D\', "a" = \'TEN\' WHERE id = 1')
    db.execute(f'UPDATE {QUALIFIED} SET id = 20, "A" = 21 WHERE id = 2')
    db.execute(f"DELETE FROM {QUALIFIED} WHERE id = 3")
    db.execute(f"INSERT INTO {QUALIFIED} VALUES (4, 'I', 40, 'forty', 4)")

    run = ingest(db.dsn, *args, "--output", out, "--typed-tables")
    assert run.exit_code == 0, run.stderr

    name = layout.table_dir_name(SCHEMA, TABLE)
    typed_root = Path(out) / layout.TABLES
    assert [p.name for p in typed_root.iterdir()] == [name]
    assert layout.parse_table_dir_name(name) == (SCHEMA, TABLE)
    partitions = [p for p in (typed_root / name).iterdir() if p.name.startswith("lsn_range=")]
    assert partitions and all(list(p.glob("part-*.parquet")) for p in partitions)
    # the typed rows keep the user's "_op" apart from the change's own _op, and "A" apart from "a"
    typed = spark.read.option("mergeSchema", "true").parquet(str(typed_root / name)).orderBy("_commit_lsn", "_seq")
    assert [f.name for f in typed.schema.fields][:5] == ["id", "_op__2", "A", "a__2", "n"]
    first = typed.first()
    assert first is not None
    assert (first["_op"], first["_op__2"], first["A"], first["a__2"]) == ("I", "x", 10, "ten")

    code, tables, err = materialize(out)
    assert code == 0, err
    assert [t["table"] for t in tables] == [f"{SCHEMA}.{TABLE}"], tables
    assert tables[0]["path"].endswith(name)
    assert _state(out) == sorted(_source(db))
    assert _source(db) == [
        (1, "D", 10, "TEN", Decimal("1.50")), (4, "I", 40, "forty", Decimal("4.00")), (20, "y", 21, "twenty", None)
    ]
