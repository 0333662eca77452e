"""pgpoll materialize end to end on both plugins: each kind of change lands in the state as the source holds it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.ingest.conftest import capture_args, ingest
from tests.materialize.conftest import materialize, state_rows


def _setup(db: Any, plugin: str, identity: str = "") -> tuple[str, list[str]]:
    db.require_plugin(plugin)
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text, big text, n numeric(10,2))")
    if identity:
        db.execute(f"ALTER TABLE t REPLICA IDENTITY {identity}")
    args = capture_args(db, plugin, "t")
    return args[1], args[2:]


def _source(db: Any) -> list[dict[str, Any]]:
    rows = db.execute("SELECT id, name, big, n FROM t ORDER BY id")
    return [dict(zip(("id", "name", "big", "n"), r, strict=True)) for r in rows]


def _state(spark: Any, out: str) -> list[dict[str, Any]]:
    return sorted(state_rows(spark, out, "public", "t"), key=lambda r: r["id"])


def _short(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with long text shortened to length and ending, for readable assertion messages."""
    return [
        {k: (f"<{len(v)} chars ..{v[-3:]}>" if isinstance(v, str) and len(v) > 40 else v) for k, v in r.items()} for r in rows
    ]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
@pytest.mark.parametrize("identity", ["", "FULL"])
def test_state_equals_source_after_every_kind_of_change(db: Any, spark: Any, tmp_path: Path, plugin: str, identity: str) -> None:
    slot, extra = _setup(db, plugin, identity)
    out = str(tmp_path / "out")
    big = "x" * 20000 + "y"  # TOASTed (compressible, so stored external only when large enough uncompressed)
    db.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    db.execute("INSERT INTO t VALUES (1, 'a', %s, 1.50), (2, 'b', NULL, NULL), (3, 'c', 'small', 3)", (big,))
    db.execute("UPDATE t SET name = 'a2' WHERE id = 1")  # big unchanged -> not sent
    db.execute("UPDATE t SET id = 10 WHERE id = 2")  # key change
    db.execute("DELETE FROM t WHERE id = 3")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)
    assert code == 0, err
    assert [t["table"] for t in tables] == ["public.t"] and tables[0]["mode"] == "full"
    assert _short(_state(spark, out)) == _short(_source(db))

    # incremental: more changes, including an UPDATE of the moved row and a TRUNCATE followed by inserts
    db.execute("UPDATE t SET n = 7.25 WHERE id = 1")
    db.execute("UPDATE t SET name = 'ten' WHERE id = 10")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)
    assert code == 0 and tables[0]["mode"] == "incremental", err
    assert _short(_state(spark, out)) == _short(_source(db))

    db.execute("TRUNCATE t")
    db.execute("INSERT INTO t VALUES (5, 'after truncate', NULL, 5)")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)
    assert code == 0, err
    assert _short(_state(spark, out)) == _short(_source(db))
    code, tables, _ = materialize(out)
    assert tables[0]["mode"] == "unchanged"
    full = materialize(out, "--full", "--to", str(tmp_path / "rebuilt"))
    assert full[0] == 0 and full[1][0]["mode"] == "full"
    assert sorted(state_rows(spark, out, "public", "t", str(tmp_path / "rebuilt")), key=lambda r: r["id"]) == _source(db)


def test_columns_named_like_state_columns_keep_their_stored_names(db: Any, spark: Any, tmp_path: Path) -> None:
    db.execute('CREATE TABLE clash (id int PRIMARY KEY, "_commit_lsn" int, "_untyped" text)')
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    db.execute("INSERT INTO clash VALUES (1, 10, 'a'), (2, 20, 'b')")
    db.execute('UPDATE clash SET "_untyped" = \'c\' WHERE id = 2')
    out = str(tmp_path / "out")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables").exit_code == 0
    code, _tables, err = materialize(out)
    assert code == 0, err
    frame = spark.read.parquet(str(Path(out) / "state" / "public.clash"))
    rows = sorted((r["id"], r["_commit_lsn__2"], r["_untyped__2"], r["_commit_lsn"] > 0) for r in frame.collect())
    assert rows == [(1, 10, "a", True), (2, 20, "c", True)]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_a_key_reused_by_a_moved_row_carries_the_moved_rows_toast_value(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    slot, extra = _setup(db, plugin)
    db.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    out = str(tmp_path / "out")
    db.execute("INSERT INTO t VALUES (1, 'one', %s, 1), (2, 'two', %s, 2)", ("A" * 9000, "B" * 9000))
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    assert materialize(out)[0] == 0
    # one batch: key 1 deleted, row 2 moves to key 1 (big unchanged, not sent), then updated (big again not sent)
    db.execute("DELETE FROM t WHERE id = 1")
    db.execute("UPDATE t SET id = 1 WHERE id = 2")
    db.execute("UPDATE t SET name = 'x' WHERE id = 1")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)
    assert code == 0 and not tables[0]["warnings"], err
    assert _short(_state(spark, out)) == _short(_source(db))
    assert _state(spark, out)[0]["big"] == "B" * 9000


def test_a_batch_of_deletes_only_keeps_the_other_columns(db: Any, spark: Any, tmp_path: Path) -> None:
    slot, extra = _setup(db, "test_decoding")  # test_decoding's DELETE shows only the old key
    out = str(tmp_path / "out")
    db.execute("INSERT INTO t VALUES (1, 'one', 'b1', 1.5), (2, 'two', 'b2', 2.5)")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    assert materialize(out)[0] == 0
    db.execute("DELETE FROM t WHERE id = 1")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)
    assert code == 0 and tables[0]["mode"] == "incremental", err
    assert _short(_state(spark, out)) == _short(_source(db)) == [{"id": 2, "name": "two", "big": "b2", "n": Decimal("2.50")}]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_keys_holding_values_the_typed_column_cannot_hold_stay_apart(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    db.require_plugin(plugin)
    db.execute("CREATE TABLE v (id int, valid_to date, note text, PRIMARY KEY (id, valid_to))")
    args = capture_args(db, plugin, "v")
    slot, extra = args[1], args[2:]
    out = str(tmp_path / "out")
    db.execute("INSERT INTO v VALUES (1, 'infinity', 'a'), (1, '-infinity', 'b'), (1, '2024-01-01', 'c')")
    db.execute("UPDATE v SET note = 'a2' WHERE valid_to = 'infinity'")
    db.execute("UPDATE v SET valid_to = '2025-01-01' WHERE valid_to = '-infinity'")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, _tables, err = materialize(out)
    assert code == 0, err
    frame = spark.read.parquet(str(Path(out) / "state" / "public.v"))
    state = sorted(
        (r["id"], (r["_untyped"] or {}).get("valid_to") or r["valid_to"].isoformat(), r["note"]) for r in frame.collect()
    )
    source = sorted(tuple(r) for r in db.execute("SELECT id, valid_to::text, note FROM v"))
    assert state == source == [(1, "2024-01-01", "c"), (1, "2025-01-01", "b"), (1, "infinity", "a2")]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_a_full_rebuild_across_a_replica_identity_switch_replays_each_stretch_its_own_way(
    db: Any, spark: Any, tmp_path: Path, plugin: str
) -> None:
    slot, extra = _setup(db, plugin)
    out = str(tmp_path / "out")
    db.execute("INSERT INTO t VALUES (1, 'a', NULL, 1), (2, 'b', NULL, 2)")
    db.execute("UPDATE t SET name = 'a2' WHERE id = 1")  # REPLICA IDENTITY DEFAULT: no old row sent
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    db.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    db.execute("UPDATE t SET name = 'a3' WHERE id = 1")  # FULL: the whole old row is sent
    db.execute("DELETE FROM t WHERE id = 2")
    db.execute("INSERT INTO t VALUES (3, 'c', NULL, 3), (3 + 1, 'c', NULL, 3)")
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", *extra).exit_code == 0
    code, tables, err = materialize(out)  # the first materialize: a full pass over both stretches
    assert code == 0 and tables[0]["mode"] == "full", err
    assert _short(_state(spark, out)) == _short(_source(db))
    code, _tables, err = materialize(out, "--full", "--to", str(tmp_path / "rebuilt"))
    assert code == 0, err
    rebuilt = sorted(state_rows(spark, out, "public", "t", str(tmp_path / "rebuilt")), key=lambda r: r["id"])
    assert _short(rebuilt) == _short(_source(db))
