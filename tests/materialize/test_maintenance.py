"""State maintenance inside ``materialize``: many small runs leave Delta and Iceberg states whose files and
snapshots stay bounded, read by DuckDB and pyiceberg, with time travel within the retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pgpoll.materialize import maintenance
from pgpoll.materialize.maintenance import parse_retention
from tests.ingest.conftest import Capture, ingest, make_capture
from tests.materialize.conftest import materialize
from tests.materialize.delta.test_mirror import duckdb_delta_rows
from tests.materialize.iceberg.test_iceberg_state import catalog


def _round(capture: Capture, i: int) -> None:
    """One small change (a row updated, one added) and the ingest run that captures it."""
    capture.db.execute(f"UPDATE items SET v = 'r{i}' WHERE id = {i % 5 + 1}")
    capture.db.execute(f"INSERT INTO items VALUES ({100 + i}, 'n{i}')")
    assert ingest(capture.db.dsn, *capture.args("--typed-tables")).exit_code == 0


def test_the_retention_parses_days_hours_minutes_and_off() -> None:
    assert [parse_retention(t) for t in ("7d", "168h", "90m", "2", "off")] == [168.0, 168.0, 1.5, 2.0, None]
    with pytest.raises(ValueError, match="7d, 168h, 90m"):
        parse_retention("a week")


def test_a_delta_state_is_checkpointed_and_vacuumed_and_keeps_its_versions_within_the_retention(
    db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "MAINTAIN_EVERY", 2)  # every other version, not every 10th: fewer runs
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    dest = tmp_path / "state"
    table = dest / "public.items"
    done: list[dict[str, Any]] = []
    for i in range(4):  # within the retention: nothing vacuumed, every version readable
        code, states, err = materialize(capture.output, "--to", str(dest), "--format", "delta", "--state-retention", "1h")
        assert code == 0, err
        done += [s["maintenance"] for s in states if "maintenance" in s]
        _round(capture, i)
    assert done and all(m["vacuumed_files"] == 0 and m["retention_hours"] == 1.0 for m in done), done
    assert list((table / "_delta_log").glob("*.checkpoint.parquet"))
    first = DeltaTable(str(table), version=0).to_pyarrow_table()  # time travel to the first state
    assert first.num_rows == 20

    monkeypatch.setenv("PGPOLL_STATE_RETENTION", "0h")  # the environment variable; 0: remove what no version needs
    vacuumed = 0
    for i in range(4, 8):
        _round(capture, i)
        code, states, err = materialize(capture.output, "--to", str(dest), "--format", "delta")
        assert code == 0, err
        vacuumed += sum(s["maintenance"]["vacuumed_files"] for s in states if "maintenance" in s)
    assert vacuumed > 0
    current = DeltaTable(str(table))
    live = {str(p) for p in current.file_uris()}
    on_disk = {str(p) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}
    assert len(on_disk - live) <= 2, on_disk - live  # at most the files the runs since the last vacuum replaced
    expected = [tuple(r) for r in db.execute("SELECT id, v FROM items ORDER BY id")]
    assert sorted((r["id"], r["v"]) for r in duckdb_delta_rows(table)) == expected

    code, states, err = materialize(capture.output, "--to", str(dest), "--format", "delta", "--state-retention", "off")
    assert code == 0 and all("maintenance" not in s for s in states), (states, err)


def test_an_iceberg_state_expires_snapshots_older_than_the_retention(db: Any, tmp_path: Path) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    dest = tmp_path / "state"
    args = ["--to", str(dest), "--format", "iceberg"]
    for i in range(3):
        code, states, err = materialize(capture.output, *args, "--state-retention", "1h")
        assert code == 0, err
        assert states[0]["maintenance"]["expired_snapshots"] == 0
        _round(capture, i)
    table = catalog(dest).load_table(("public", "items"))
    kept = list(table.snapshots())
    assert len(kept) >= 3
    oldest = table.scan(snapshot_id=kept[0].snapshot_id).to_arrow()  # time travel within the retention
    assert oldest.num_rows == 20

    code, states, err = materialize(capture.output, *args, "--state-retention", "0m")
    assert code == 0, err
    assert states[0]["maintenance"]["expired_snapshots"] >= 3 and states[0]["maintenance"]["snapshots"] == 1
    table = catalog(dest).load_table(("public", "items"))
    assert len(list(table.snapshots())) == 1
    rows = sorted((r["id"], r["v"]) for r in table.scan().to_arrow().select(["id", "v"]).to_pylist())
    assert rows == [tuple(r) for r in db.execute("SELECT id, v FROM items ORDER BY id")]
