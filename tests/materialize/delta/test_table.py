"""The Delta edge and the destination lease without a JVM: pinned commits, idempotence, conflicts, busy and stale leases."""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from pgpoll.errors import SinkError, SlotBusyError
from pgpoll.materialize.delta.files import always_rewritten, has_key_stats, range_rows, refusal
from pgpoll.materialize.delta.table import DataFile, DeltaStateTable, app_id, delta_uri, footer_files
from pgpoll.materialize.dest_lease import LEASE_FILE, DestLease
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.stores.local import open_local

APP = app_id("file:/lake/state")
SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("v", pa.string())])


def _file(root: Path, name: str, ids: list[int]) -> DataFile:
    path = root / "run" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int32()), "v": [str(i) for i in ids]}), path)
    return DataFile(f"run/{name}", path.stat().st_size, len(ids), {"id": min(ids)}, {"id": max(ids)}, {"id": 0})


def _ids(root: Path, version: int | None = None) -> list[int]:
    return sorted(read_delta(str(root), version).column("id").to_pylist())


def test_commits_replace_the_pinned_state_and_record_the_position(tmp_path: Path) -> None:
    table = DeltaStateTable(str(tmp_path), APP)
    first = table.pin()
    assert first.version is None and first.applied is None
    assert not table.holds_files_under("run")
    assert table.commit(first, [_file(tmp_path, "a.parquet", [1, 2])], SCHEMA, 100, {"schema_id": "s1", "rows": 2}) == 0
    assert table.holds_files_under("run") and not table.holds_files_under("ru")
    pinned = table.pin()
    assert (pinned.version, pinned.applied, pinned.files) == (0, 100, ("run/a.parquet",))
    assert pinned.meta is not None and pinned.meta["schema_id"] == "s1" and pinned.readable
    assert table.commit(pinned, [_file(tmp_path, "b.parquet", [2, 3])], SCHEMA, 200, {"schema_id": "s1"}) == 1
    assert _ids(tmp_path) == [2, 3] and _ids(tmp_path, 0) == [1, 2]  # each version readable by time travel
    stats = DeltaTable(str(tmp_path)).get_add_actions(flatten=True)
    assert pa.table(stats).column("num_records").to_pylist() == [2]
    assert pa.table(stats).column("max.id").to_pylist() == [3]


def test_a_position_already_applied_is_skipped_unless_forced(tmp_path: Path) -> None:
    table = DeltaStateTable(str(tmp_path), APP)
    table.commit(table.pin(), [_file(tmp_path, "a.parquet", [1])], SCHEMA, 100, {})
    pinned = table.pin()
    assert table.commit(pinned, [_file(tmp_path, "b.parquet", [5])], SCHEMA, 100, {}) is None
    assert table.commit(pinned, [_file(tmp_path, "c.parquet", [6])], SCHEMA, 50, {}) is None
    assert DeltaTable(str(tmp_path)).version() == 0 and _ids(tmp_path) == [1]
    assert table.commit(pinned, [_file(tmp_path, "d.parquet", [7])], SCHEMA, 100, {}, force=True) == 1  # --full
    assert _ids(tmp_path) == [7]


@pytest.mark.parametrize("when", ["before the check", "between the check and the commit"])
def test_a_version_written_by_another_writer_is_a_conflict_not_merged_over(
    tmp_path: Path, when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = DeltaStateTable(str(tmp_path), APP)
    table.commit(table.pin(), [_file(tmp_path, "a.parquet", [1])], SCHEMA, 100, {})
    pinned = table.pin()
    foreign = pa.table({"id": pa.array([99], pa.int32()), "v": ["x"]})
    if when == "before the check":
        write_deltalake(str(tmp_path), foreign, mode="append")
    else:  # the check passes; the foreign commit lands just before ours
        real, calls = table.latest_version, []

        def late_writer() -> int | None:
            found = real()
            if not calls:
                write_deltalake(str(tmp_path), foreign, mode="append")
            calls.append(found)
            return found

        monkeypatch.setattr(table, "latest_version", late_writer)
    with pytest.raises(SinkError) as raised:
        table.commit(pinned, [_file(tmp_path, "b.parquet", [2])], SCHEMA, 200, {})
    assert "version 1 was written by delta-rs" in raised.value.message and "read version 0" in raised.value.message
    assert DeltaTable(str(tmp_path)).version() == 1 and _ids(tmp_path) == [1, 99]
    assert DeltaTable(str(tmp_path)).transaction_version(APP) == 100


def test_the_first_commit_never_replaces_a_table_created_meanwhile(tmp_path: Path) -> None:
    table = DeltaStateTable(str(tmp_path), APP)
    pinned = table.pin()
    write_deltalake(str(tmp_path), pa.table({"id": pa.array([5], pa.int32()), "v": ["y"]}))
    with pytest.raises(SinkError, match="version 0 was written by"):
        table.commit(pinned, [_file(tmp_path, "a.parquet", [1])], SCHEMA, 100, {})
    assert _ids(tmp_path) == [5]


def test_delta_uri_gives_delta_rs_local_paths_and_s3() -> None:
    assert delta_uri("file:/lake/state/public.t") == "/lake/state/public.t"  # checkout-paths: data
    assert delta_uri("/lake/x") == "/lake/x"  # checkout-paths: data
    assert delta_uri("s3a://bucket/state/public.t") == "s3://bucket/state/public.t"
    assert DataFile("p", 1, 0, {"id": 1}).stats_json() == json.dumps({"numRecords": 0})


def test_a_second_run_is_busy_at_once_and_a_stale_lease_is_taken_over(tmp_path: Path) -> None:
    fs = open_local(str(tmp_path / "dest"))
    with DestLease(fs, run="first", enabled=True):
        assert (tmp_path / "dest" / LEASE_FILE).exists()
        with pytest.raises(SlotBusyError, match="another pgpoll materialize \\(run first\\)"):
            DestLease(fs, run="second", enabled=True).acquire()
    assert not (tmp_path / "dest" / LEASE_FILE).exists()  # released: DEST holds only the tables
    # a run killed with SIGKILL leaves its lease; once expired it blocks nobody
    (tmp_path / "dest" / LEASE_FILE).write_text(json.dumps({"run": "killed", "expires_at": time.time() - 1}))
    with DestLease(fs, run="next", enabled=True) as lease:
        assert lease.holder() is not None and lease.holder()[0] == "next"  # type: ignore[index]


def test_the_lease_is_renewed_while_the_run_works(tmp_path: Path) -> None:
    fs = open_local(str(tmp_path))
    with DestLease(fs, run="slow", ttl=0.3, enabled=True) as lease:
        time.sleep(0.5)  # longer than the ttl: renewed meanwhile
        with pytest.raises(SlotBusyError):
            DestLease(fs, run="other", ttl=0.3, enabled=True).acquire()
        assert lease.held


def test_footer_files_take_counts_and_key_ranges_from_the_row_groups(tmp_path: Path) -> None:
    ids = pa.array([5, 3, None, None, 9, 1], pa.int32())
    days = pa.array([date(2024, 1, 2), None, None, None, date(1999, 12, 31), date(2030, 5, 6)], pa.date32())
    pq.write_table(pa.table({"id": ids, "d": days, "v": ["a", "b", "c", "d", "e", "f"]}), tmp_path / "p1.parquet",
                   row_group_size=2)  # row groups: [5, 3], [None, None], [9, 1]
    pq.write_table(pa.table({"id": pa.array([], pa.int32()), "d": pa.array([], pa.date32()), "v": pa.array([], pa.string())}),
                   tmp_path / "p0.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    empty, full = footer_files(str(tmp_path), "run", ["id", "d", "missing"])
    assert (empty.path, empty.records, empty.stats_json()) == ("run/p0.parquet", 0, '{"numRecords": 0}')
    assert (full.path, full.size, full.records) == ("run/p1.parquet", (tmp_path / "p1.parquet").stat().st_size, 6)
    assert json.loads(full.stats_json()) == {
        "numRecords": 6, "minValues": {"id": 1, "d": "1999-12-31"}, "maxValues": {"id": 9, "d": "2030-05-06"},
        "nullCount": {"id": 2, "d": 3},
    }


def test_a_partial_commit_replaces_only_the_files_it_names_and_the_log_gives_their_ranges_back(tmp_path: Path) -> None:
    table = DeltaStateTable(str(tmp_path), APP)
    old = [_file(tmp_path, "a.parquet", [1, 2]), _file(tmp_path, "b.parquet", [3, 4]), _file(tmp_path, "c.parquet", [5, 6])]
    table.commit(table.pin(), old, SCHEMA, 100, {"rows": 6})
    pinned = table.pin()
    assert [(f.path, f.size, f.records, dict(f.min_values), dict(f.max_values), dict(f.null_count)) for f in pinned.stats] == [
        (f.path, f.size, f.records, {"id": lo}, {"id": hi}, {"id": 0}) for f, (lo, hi) in zip(old, [(1, 2), (3, 4), (5, 6)],
                                                                                           strict=True)]
    new = [_file(tmp_path, "d.parquet", [3, 7])]
    assert table.commit(pinned, new, SCHEMA, 200, {"rows": 5}, replaces=[pinned.stats[1]]) == 1
    assert _ids(tmp_path) == [1, 2, 3, 5, 6, 7] and _ids(tmp_path, 0) == [1, 2, 3, 4, 5, 6]
    assert sorted(table.pin().files) == ["run/a.parquet", "run/c.parquet", "run/d.parquet"]
    log = [json.loads(line) for line in (tmp_path / "_delta_log" / "00000000000000000001.json").read_text().splitlines()]
    assert [a["remove"]["path"] for a in log if "remove" in a] == ["run/b.parquet"]
    assert [a["add"]["path"] for a in log if "add" in a] == ["run/d.parquet"]
    assert DeltaTable(str(tmp_path)).transaction_version(APP) == 200
    assert table.commit(table.pin(), new, SCHEMA, 200, {}, replaces=[]) is None  # applied already: skipped as before


def test_the_partial_rewrite_is_refused_unless_it_is_exact() -> None:
    ranged = DataFile("r", 1, 10, {"id": 1}, {"id": 9}, {"id": 0})
    nulls = DataFile("n", 1, 4, {"id": 20}, {"id": 30}, {"id": 2})
    all_null = DataFile("z", 1, 3, {}, {}, {"id": 3})
    empty = DataFile("e", 1, 0)
    assert [has_key_stats(f, ["id"]) for f in (ranged, nulls, all_null, empty)] == [True, True, True, True]
    assert not has_key_stats(DataFile("x", 1, 5, {}, {}, {"id": 0}), ["id"])  # no range though not all null
    assert not has_key_stats(DataFile("x", 1, -1, {"id": 1}, {"id": 2}, {"id": 0}), ["id"])  # no record count
    assert [always_rewritten(f, ["id"]) for f in (ranged, nulls, all_null, empty)] == [False, True, True, True]
    assert range_rows([ranged, nulls, all_null], ["id"]) == [("r", 1, 9)]
    ok = {"truncated": False, "identity_changes": False, "same_schema": True}
    assert refusal([ranged, nulls], ["id"], ["id"], **ok) is None
    assert refusal([ranged], [], [], **ok) == "the table has no key"
    assert refusal([ranged], ["id"], ["id", "v"], **ok) == "the previous state was written for another key"
    assert refusal([ranged], ["id"], ["id"], **{**ok, "truncated": True}) == "a TRUNCATE"
    assert refusal([ranged], ["id"], ["id"], **{**ok, "identity_changes": True}) == "the replica identity changed"
    assert refusal([ranged], ["id"], ["id"], **{**ok, "same_schema": False}) == "the schema changed"
    assert refusal([ranged, nulls, all_null, empty], ["id"], ["id"], **ok) is None
    assert refusal([ranged, DataFile("x", 1, 5)], ["id"], ["id"], **ok) == "a file without statistics for the key"
    assert refusal([ranged], ["id", "v"], ["id", "v"], **ok) == "a file without statistics for the key"
