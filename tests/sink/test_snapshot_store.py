"""The snapshot's files without a JVM or a server: format, exclusive manifests, the attempt race, resume, latest_complete."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pgpoll.errors import SinkError, SlotBusyError
from pgpoll.sink import layout
from pgpoll.sink.snapshot_store import (
    SnapshotStore,
    find_resumable,
    is_snapshot_id,
    latest_complete,
    list_snapshots,
    new_snapshot_id,
    table_lease,
)
from pgpoll.sink.stores.filesystem import open_output


def _plan(sid: str, tables: list[tuple[str, str]], args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "format": 1, "snapshot_id": sid, "slot": "s", "plugin": "pgoutput", "publications": ["p"],
        "args": args or {"slot": "s"}, "created_at": "x", "plan_lsn": "0/10", "plan_lsn_int": 16,
        "tables": [
            {"schema": s, "table": t, "dir": layout.table_dir_name(s, t), "mode": "chunked", "key": ["id"],
             "chunks": [{"n": 0, "lo": None, "hi": [10]}, {"n": 1, "lo": [10], "hi": None}]}
            for s, t in tables
        ],
    }


def _write_attempt(store: SnapshotStore, table_dir: str, n: int, payload: bytes = b"data") -> str:
    name, path = store.attempt(table_dir, n)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(payload)
    return name


def test_snapshot_ids_sort_by_start_time_and_are_recognised() -> None:
    a = new_snapshot_id(datetime(2026, 11, 23, 6, 45, tzinfo=UTC))
    b = new_snapshot_id(datetime(2026, 11, 23, 6, 46, tzinfo=UTC))
    assert a.startswith("20261123T064500Z-") and len(a) == 21
    assert a < b and is_snapshot_id(a) and not is_snapshot_id("_leases") and not is_snapshot_id("2026")


def test_files_land_where_the_format_says(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    sid = new_snapshot_id()
    store = SnapshotStore(fs, sid)
    store.create_plan(_plan(sid, [("public", "t")]))
    with pytest.raises(SinkError):
        store.create_plan(_plan(sid, [("public", "t")]))  # exclusive
    name = _write_attempt(store, "public.t", 3)
    assert store.publish("public.t", 3, name, {"rows": 5, "bytes": 4, "snapshot": {"xmin": 1, "xmax": 2, "xip": []}})
    assert (tmp_path / "_pgpoll/snapshots" / sid / "plan.json").is_file()
    manifest = json.loads((tmp_path / "_pgpoll/snapshots" / sid / "public.t/chunk-000003.json").read_text())
    assert manifest["files"] == ["chunk=3/part-00000.parquet"] and manifest["attempt"] == name and manifest["rows"] == 5
    assert (tmp_path / "snapshots" / sid / "public.t/chunk=3/part-00000.parquet").read_bytes() == b"data"
    assert not list((tmp_path / "snapshots" / sid / "public.t/_attempts").iterdir())
    assert store.complete() is None
    assert store.write_complete({"snapshot_id": sid, "rows": 5})["rows"] == 5
    assert store.write_complete({"snapshot_id": sid, "rows": 9})["rows"] == 5  # the first completion stays
    assert list_snapshots(fs) == [sid]


def test_of_two_attempts_at_one_chunk_the_first_manifest_wins_and_the_loser_deletes_its_attempt(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    store = SnapshotStore(fs, new_snapshot_id())
    names = [_write_attempt(store, "public.t", 0, f"attempt {i}".encode()) for i in range(8)]
    results: dict[str, bool] = {}

    def publish(name: str) -> None:
        results[name] = store.publish("public.t", 0, name, {"rows": 1})

    threads = [threading.Thread(target=publish, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, won in results.items() if won]
    assert len(winners) == 1
    assert store.manifests("public.t")[0]["attempt"] == winners[0]
    final = Path(store.final_path("public.t", 0))
    assert final.read_bytes() == f"attempt {names.index(winners[0])}".encode()
    assert not list(Path(store.data("public.t", "_attempts")).iterdir())


def test_resume_finishes_renames_deletes_unnamed_attempts_and_forgets_lost_chunks(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    store = SnapshotStore(fs, new_snapshot_id())
    # chunk 0: manifest written, the task died before the rename
    won = _write_attempt(store, "public.t", 0, b"zero")
    fs.create_exclusive(store.meta("public.t", "chunk-000000.json"), json.dumps({"n": 0, "attempt": won, "rows": 1}))
    # chunk 1: an attempt without a manifest (the task died before publishing)
    _write_attempt(store, "public.t", 1)
    # chunk 2: a manifest whose data is gone
    fs.create_exclusive(store.meta("public.t", "chunk-000002.json"), json.dumps({"n": 2, "attempt": "2-x.parquet"}))
    done = store.resume_table("public.t")
    assert sorted(done) == [0]
    assert Path(store.final_path("public.t", 0)).read_bytes() == b"zero"
    assert not list(Path(store.data("public.t", "_attempts")).iterdir())
    assert not fs.exists(store.meta("public.t", "chunk-000002.json"))
    store.reset_table("public.t")
    assert store.manifests("public.t") == {} and not fs.exists(store.data("public.t"))


def test_find_resumable_takes_the_incomplete_snapshot_with_the_same_arguments(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    args = {"slot": "s", "tables": ["public.t"]}
    old = SnapshotStore(fs, new_snapshot_id(datetime(2026, 1, 1, tzinfo=UTC)))
    old.create_plan(_plan(old.snapshot_id, [("public", "t")], args))
    other = SnapshotStore(fs, new_snapshot_id(datetime(2026, 1, 2, tzinfo=UTC)))
    other.create_plan(_plan(other.snapshot_id, [("public", "t")], {"slot": "s", "tables": ["public.u"]}))
    assert find_resumable(fs, args) == old.snapshot_id
    old.write_complete({"snapshot_id": old.snapshot_id})
    assert find_resumable(fs, args) is None


def test_latest_complete_is_the_greatest_complete_id_holding_the_table(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    assert latest_complete(fs, "public", "t") is None
    sids = [new_snapshot_id(datetime(2026, 1, d, tzinfo=UTC)) for d in (1, 2, 3, 4)]
    tables = [[("public", "t")], [("public", "t"), ("public", "u")], [("public", "u")], [("public", "t")]]
    for sid, tabs in zip(sids, tables, strict=True):
        store = SnapshotStore(fs, sid)
        store.create_plan(_plan(sid, tabs))
        for s, t in tabs:
            for n in (1, 0):
                store.publish(layout.table_dir_name(s, t), n, _write_attempt(store, f"{s}.{t}", n), {"rows": n})
        if sid != sids[3]:  # the newest is incomplete
            store.write_complete({"snapshot_id": sid, "convergence_lsn": "0/20"})
    found = latest_complete(fs, "public", "t")
    assert found is not None and found.snapshot_id == sids[1]
    assert found.table["dir"] == "public.t" and [m["n"] for m in found.manifests] == [0, 1]
    assert found.complete["convergence_lsn"] == "0/20"
    assert found.chunk_paths() == [f"{tmp_path}/snapshots/{sids[1]}/public.t/chunk={n}/part-00000.parquet" for n in (0, 1)]
    u = latest_complete(fs, "public", "u")
    assert u is not None and u.snapshot_id == sids[2]
    assert latest_complete(fs, "public", "missing") is None


def test_a_second_run_on_the_same_table_is_busy_another_table_is_not(tmp_path: Path) -> None:
    fs = open_output(str(tmp_path))
    first = table_lease(fs, "public", "t", run="one", slot="s", enabled=True)
    first.acquire()
    with pytest.raises(SlotBusyError, match=r"another snapshot run \(one.* holds table public\.t"):
        table_lease(fs, "public", "t", run="two", slot="s", enabled=True).acquire()
    table_lease(fs, "public", "u", run="two", slot="s", enabled=True).acquire()
    assert (tmp_path / "_pgpoll/leases/snapshot-public.t.json").is_file()
    assert not (tmp_path / layout.LEASE).exists()  # the ingest lease is another file
    first.release()
    table_lease(fs, "public", "t", run="two", slot="s", enabled=True).acquire()
