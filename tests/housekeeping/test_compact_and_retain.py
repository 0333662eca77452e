"""``pgpoll compact`` and ``pgpoll retain`` on one output, one after the other, as the daily job runs them.

Many small batches with typed tables are merged, then a retention cuts inside
a merge (the floor is lowered to keep it whole, the merges below it go),
then past it, then more ingests, compaction and retention again. After each
step: :mod:`pgpoll.reader` returns every change above the floor exactly once,
the change table's Delta log (read with ``deltalake``) holds exactly the same,
every file a record or the compaction map names above the floor is there,
and none of a merge below it (the map may list one until the next compaction
record); the Spark reader's typed table after the first cut; a state
materialized from a snapshot equals the source.
The cuts are placed with :func:`run_retain`'s ``now`` (a retention is an age:
the CLI's ``--retention 0`` cannot aim inside one merge), the last one with the
CLI. A second test: either command refuses (exit 3, nothing changed) while
the other holds its lease.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.housekeeping.leases import compaction_lease, retention_lease
from pgpoll.housekeeping.retention import run_retain
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.compactions import CompactionLog, Merge, load_map
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import parse_timestamp
from pgpoll.sink.stores.filesystem import open_output
from tests.housekeeping.test_compact import changes, compact, source, state_rows, typed_rows
from tests.ingest.conftest import Capture, ingest, make_capture

Change = tuple[int, int, str]


def delta_changes(output: str) -> list[Change]:
    """``(commit_lsn, seq, op)`` of the change table's current version, read with deltalake itself."""
    table = DeltaTable(str(Path(output) / "changes")).to_pyarrow_table(columns=["commit_lsn", "seq", "op"])
    return sorted(zip(*(table.column(c).to_pylist() for c in ("commit_lsn", "seq", "op")), strict=True))


def workload(cap: Capture, round_: int, batches: int) -> None:
    """``batches`` small transactions (inserts, updates, deletes), ingested one batch each, with typed tables."""
    base = round_ * 100
    for i in range(batches):
        if i % 3 == 2:
            cap.db.execute(f"UPDATE items SET v = v || '+' WHERE id BETWEEN {base + i - 2} AND {base + i - 1}")
        elif i % 5 == 4:
            cap.db.execute(f"DELETE FROM items WHERE id = {base + i - 1}")
        else:
            cap.db.execute(f"INSERT INTO items SELECT g, 'v' || g FROM generate_series({base + i * 3}, {base + i * 3 + 2}) g")
    assert ingest(cap.db.dsn, *cap.args("--typed-tables", "--batch-changes", "1")).exit_code == 0


def snapshot(cap: Capture) -> None:
    result = CliRunner().invoke(cli, ["snapshot", "--slot", cap.slot, "--output", cap.output, "--publication",
                                      "pub_items", "--tables", "public.items", "--json"], env={"PGPOLL_DSN": cap.db.dsn})
    assert result.exit_code == 0, result.output


def merges(output: str) -> list[Merge]:
    found = CompactionLog(open_output(output)).newest()
    return list(found.merges) if found is not None else []


def floor_of(output: str) -> tuple[int, int]:
    """The retention floor's record and end LSN (0, 0: none)."""
    found = read_floor(open_output(output))
    return (found.seq, int(found.end_lsn)) if found is not None else (0, 0)


def cut_at(output: str, seq: int) -> dict[str, Any]:
    """``pgpoll retain`` with its cutoff just after commit-log record ``seq`` (records up to ``seq`` are old enough)."""
    now = parse_timestamp(CommitLog(open_output(output)).read(seq + 1).committed_at)
    return run_retain(output, timedelta(0), now=now)


def check(output: str, everything: list[Change]) -> None:
    """What every step must leave (see the module docstring)."""
    fs = open_output(output)
    floor, end = floor_of(output)
    read = changes(output)
    assert read == [c for c in everything if c[0] > end]  # every change above the floor, once
    assert delta_changes(output) == read
    log = CommitLog(fs)
    compacted = load_map(fs)
    for merge in compacted.merges:
        dirs = [(layout.CHANGES, merge.partition, merge.files)] + [
            (f"{layout.TABLES}/{t}", merge.partition, files) for t, files in merge.tables.items()]
        for where, partition, files in dirs:
            present = [fs.exists(fs.path(where, partition, name)) for name in files]
            assert all(present) if merge.last > floor else not any(present), (merge.first, merge.last, floor)
        assert merge.first > floor or merge.last <= floor  # never cut
    for record in log.records_after(floor):
        if record.partition and compacted.covering(record.seq) is None:
            assert all(fs.exists(fs.path(layout.CHANGES, record.partition, n)) for n in record.files), record.seq
            for t, files in record.table_files.items():
                assert all(fs.exists(fs.path(layout.TABLES, t, record.partition, n)) for n in files), record.seq
    for uri in DeltaTable(str(Path(output) / "changes")).file_uris():
        assert Path(uri.removeprefix("file://")).exists(), uri


def materialized_equals_source(cap: Capture, dest: Path) -> None:
    result = CliRunner().invoke(cli, ["materialize", "--output", cap.output, "--to", str(dest), "--json"])
    assert result.exit_code == 0, result.output
    assert state_rows(dest) == source(cap)


def test_compact_then_retain_inside_and_past_a_merge_then_again(db: Any, tmp_path: Path, spark: Any) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    out = cap.output
    workload(cap, 1, batches=10)
    workload(cap, 2, batches=10)
    snapshot(cap)  # retention may remove what it holds; a rebuild starts from it
    workload(cap, 3, batches=4)
    everything, typed = changes(out), typed_rows(spark, out)
    sizes = sorted(r.bytes for r in CommitLog(open_output(out)).records() if r.partition)
    code, summary, text = compact(out, "--grace", "0", "--target-size", str(4 * sizes[len(sizes) // 2]))
    assert code == 0 and summary is not None and summary["merges"] >= 3, text
    made = merges(out)
    check(out, everything)

    second = made[1]  # cut inside the second merge: the floor is lowered to keep it whole, the first one goes
    assert second.last - second.first >= 1
    done = cut_at(out, second.first)
    assert floor_of(out)[0] == second.first - 1 == done["floor"] and done["merges"] == [made[0].partition]
    assert any(f"{second.first}..{second.last}" in h for h in done["held_by"])
    assert not (Path(out) / "changes" / made[0].partition).exists()
    check(out, everything)
    assert typed_rows(spark, out) == [t for t in typed if t[0] > floor_of(out)[1]]  # typed: through the map
    left = Path(out) / "changes" / made[0].partition  # what a killed retention could leave of a merge below the floor
    shutil.copytree(Path(out) / "changes" / second.partition, left)
    (Path(out) / "_pgpoll" / "newest-checkpoint.json").unlink()  # the next start runs recovery's full pass
    report = BatchSink(None, out).recover(full=True)
    assert made[0].partition in report.removed_partitions and report.unrecorded == () and not left.exists()
    check(out, everything)
    materialized_equals_source(cap, tmp_path / "a")

    done = cut_at(out, second.last)  # past it: the second merge goes whole
    assert floor_of(out)[0] >= second.last and made[1].partition in done["merges"]
    check(out, everything)

    workload(cap, 4, batches=8)  # more batches, merged above the floor; the map forgets what retention removed
    snapshot(cap)
    workload(cap, 5, batches=4)
    everything = changes(out)
    code, summary, text = compact(out, "--grace", "0", "--target-size", str(4 * sizes[len(sizes) // 2]))
    assert code == 0 and summary is not None and summary["merges"] >= 1, text
    assert all(m.last > floor_of(out)[0] for m in merges(out))
    check(out, everything)
    result = CliRunner().invoke(cli, ["retain", "--output", out, "--retention", "0", "--json"])
    assert result.exit_code == 0, result.output
    check(out, everything)
    assert floor_of(out)[0] > second.last
    materialized_equals_source(cap, tmp_path / "b")  # a new destination: built on the second snapshot
    materialized_equals_source(cap, tmp_path / "a")  # incremental
    code, summary, text = compact(out, "--grace", "0")  # a compaction after retention: nothing lost
    assert code == 0, text
    check(out, everything)


def test_compact_and_retain_refuse_while_the_other_runs(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    out = cap.output
    workload(cap, 1, batches=6)
    fs = open_output(out)
    before = changes(out)
    other = retention_lease(fs, "other-run")
    other.acquire()
    try:
        code, _summary, text = compact(out, "--grace", "0")
        assert code == 3 and "retention" in text, text
        assert CompactionLog(fs).head() == 0 and not fs.exists(fs.path(layout.COMPACTION_LEASE))
    finally:
        other.release()
    other = compaction_lease(fs, "other-run")
    other.acquire()
    try:
        result = CliRunner().invoke(cli, ["retain", "--output", out, "--retention", "0", "--json"])
        assert result.exit_code == 3 and "compaction" in result.output, result.output
        assert read_floor(fs) is None and not fs.exists(fs.path(layout.RETAIN_LEASE))
    finally:
        other.release()
    assert changes(out) == before == delta_changes(out)
    code, _summary, text = compact(out, "--grace", "0")  # each runs once the other is done
    assert code == 0, text
    result = CliRunner().invoke(cli, ["retain", "--output", out, "--retention", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["floor"] > 0
