"""``pgpoll compact`` on real ingests: every change exactly once through every reader, state equal to the source,
fewer files; a compaction killed at each point finished or undone by the next run; two compactions fenced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.reader import read_changes_arrow
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.compactions import CompactionLog
from pgpoll.sink.delta_read import read_delta
from tests.ingest.conftest import Capture, ingest, make_capture

REPO = Path(__file__).resolve().parents[2]
KEYS = ["commit_lsn", "seq"]


def compact(output: str, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    """``pgpoll compact`` in this process: exit code, summary, output."""
    result = CliRunner().invoke(cli, ["compact", "--output", output, "--min-age", "0", *extra])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, (lines[-1] if lines else None), result.output


def compact_process(output: str, fault: str) -> int:
    """``pgpoll compact`` as a process that dies at ``fault`` (PGPOLL_FAULT)."""
    env = dict(os.environ, PGPOLL_FAULT=fault, PYTHONPATH=str(REPO))
    code = "from pgpoll.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, "compact", "--output", output, "--min-age", "0", "--grace", "0"],
                          env=env, capture_output=True, text=True, timeout=120).returncode


def changes(output: str) -> list[tuple[int, int, str]]:
    """``(commit_lsn, seq, op)`` of every change pgpoll.reader returns, in order (duplicates kept)."""
    table = read_changes_arrow(output)
    return sorted(zip(table.column("commit_lsn").to_pylist(), table.column("seq").to_pylist(),
                      table.column("op").to_pylist(), strict=True))


def delta_changes(output: str) -> list[tuple[int, int, str]]:
    table = read_delta(str(Path(output) / "changes"))
    return sorted(zip(table.column("commit_lsn").to_pylist(), table.column("seq").to_pylist(),
                      table.column("op").to_pylist(), strict=True))


def typed_rows(spark: Any, output: str) -> list[tuple[int, int, str]]:
    """``(_commit_lsn, _seq, _op)`` of the typed table through the Spark reader."""
    frame = spark.read.format("pgpoll").option("path", output).option("table", "public.items").load()
    return sorted((r["_commit_lsn"], r["_seq"], r["_op"]) for r in frame.select("_commit_lsn", "_seq", "_op").collect())


def state_rows(dest: Path) -> list[tuple[Any, ...]]:
    table = pq.read_table(str(dest / "public.items"))
    return sorted(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def materialize(output: str, dest: Path) -> None:
    result = CliRunner().invoke(cli, ["materialize", "--output", output, "--to", str(dest), "--json"])
    assert result.exit_code == 0, result.output


def workload(capture: Capture, round_: int, batches: int = 8) -> None:
    """Inserts, updates and deletes, ingested as about ``batches`` small batches with typed tables."""
    db = capture.db
    base = round_ * 100
    db.execute(f"INSERT INTO items SELECT g, 'v' || g FROM generate_series({base + 1}, {base + 20}) g")
    db.execute(f"UPDATE items SET v = v || '+' WHERE id % 3 = {round_ % 3}")
    db.execute(f"DELETE FROM items WHERE id % 7 = {round_ % 7}")
    assert ingest(db.dsn, *capture.args("--typed-tables", "--batch-changes", str(max(1, 40 // batches)))).exit_code == 0


def source(capture: Capture) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in capture.db.execute("SELECT id, v FROM items ORDER BY id")]


def partitions(output: str, where: str = "changes") -> list[str]:
    return sorted(p.name for p in (Path(output) / where).glob("lsn_range=*"))


def test_compaction_keeps_every_change_once_for_every_reader(db: Any, tmp_path: Path, spark: Any) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    out = capture.output
    workload(capture, 1)
    materialize(out, tmp_path / "early")  # a state whose position will lie inside a merge
    workload(capture, 2)
    before, typed_before = changes(out), typed_rows(spark, out)
    files_before = len(list((Path(out) / "changes").glob("lsn_range=*/*.parquet")))
    parts = partitions(out)
    assert len(parts) >= 6

    code, summary, text = compact(out)  # the default grace: the replaced partitions stay for readers that listed them
    assert code == 0, text
    assert summary is not None and summary["merges"] == 1 and summary["files_after"] < summary["files_before"]
    assert set(parts) < set(partitions(out)) and changes(out) == before == delta_changes(out)
    plain = pq.read_table(str(Path(out) / "changes"))  # a plain directory read sees the merge and its sources
    assert plain.num_rows > len(before)  # (the output contract: read a compacted output through Delta or the reader)
    code, summary, text = compact(out, "--grace", "0")  # nothing more to merge; the sources go now
    assert code == 0 and summary is not None and summary["merges"] == 0 and summary["deleted_partitions"] > 0, text
    files_after = len(list((Path(out) / "changes").glob("lsn_range=*/*.parquet")))
    assert files_after < files_before and len(partitions(out)) <= 2  # the merge (and the newest record's, if it has rows)
    assert changes(out) == before == delta_changes(out)
    assert typed_rows(spark, out) == typed_before
    log = (Path(out) / "changes" / "_delta_log")
    newest = sorted(log.glob("*.json"))[-1].read_text().splitlines()
    actions = [json.loads(line) for line in newest]
    assert {a.get("add", a.get("remove", {})).get("dataChange") for a in actions if "add" in a or "remove" in a} == {False}
    assert BatchSink(None, out).recover(full=True).unrecorded == ()  # the merged partition is named by a record

    materialize(out, tmp_path / "early")  # incremental, from inside the merge: nothing applied twice
    materialize(out, tmp_path / "full")
    assert state_rows(tmp_path / "early") == state_rows(tmp_path / "full") == source(capture)

    workload(capture, 3)  # more batches: the next run extends the small merge
    before = changes(out)
    code, summary, text = compact(out, "--grace", "0")
    assert code == 0 and summary is not None and summary["merges"] == 1, text
    assert CompactionLog(open_output_path(out)).head() == 2
    assert changes(out) == before == delta_changes(out) and len(partitions(out)) <= 2
    materialize(out, tmp_path / "early")
    assert state_rows(tmp_path / "early") == source(capture)


def open_output_path(path: str) -> Any:
    from pgpoll.sink.stores.filesystem import open_output

    return open_output(path)


def staged(output: str) -> list[str]:
    staging = Path(output) / "_pgpoll" / "compactions-staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_a_killed_compaction_leaves_nothing_a_reader_sees_and_the_next_run_undoes_or_finishes_it(
    db: Any, tmp_path: Path, spark: Any
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    out = capture.output
    workload(capture, 1)
    before, typed_before, parts = changes(out), typed_rows(spark, out), partitions(out)

    assert compact_process(out, "compact-after-write") == 137  # merged files written in place, no record
    merged = [p for p in partitions(out) if p not in parts]
    assert len(merged) == 1 and staged(out) and CompactionLog(open_output_path(out)).head() == 0
    assert changes(out) == before == delta_changes(out) and typed_rows(spark, out) == typed_before
    report = BatchSink(None, out).recover(full=True)  # a planned compaction's partition, not a loser's
    assert report.unrecorded == () and report.removed_partitions == () and merged[0] in partitions(out)
    code, summary, text = compact(out, "--grace", "0", "--target-size", "1KB")  # nothing left to merge at 1KB...
    assert code == 0 and summary is not None and summary["finished"], text  # ...but the dead run's files are gone
    assert staged(out) == [] and partitions(out) == parts
    assert not list((Path(out) / "tables").glob(f"*/{merged[0]}"))

    assert compact_process(out, "compact-after-record") == 137  # record created, Delta version not added
    assert CompactionLog(open_output_path(out)).head() == 1 and staged(out)
    assert set(parts) < set(partitions(out))  # sources kept: the Delta log does not have the merge yet
    assert changes(out) == before == delta_changes(out)
    assert typed_rows(spark, out) == typed_before  # through the compaction map: the merge's typed files
    assert BatchSink(None, out).recover(full=True).unrecorded == ()
    code, summary, text = compact(out, "--grace", "0")  # finishes the record: manifest, Delta version, sources
    assert code == 0, text
    assert staged(out) == [] and len(partitions(out)) < len(parts)
    assert changes(out) == before == delta_changes(out) and typed_rows(spark, out) == typed_before
    materialize(out, tmp_path / "state")
    assert state_rows(tmp_path / "state") == source(capture)


def test_two_compactions_planned_on_one_record_are_fenced(db: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from pgpoll.errors import SlotBusyError
    from pgpoll.housekeeping.compact import Compaction, CompactOptions

    monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")  # the fence alone
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    out = capture.output
    workload(capture, 1)
    before = changes(out)
    opts = CompactOptions(out, min_age=0, grace=0)

    class Overtaken(Compaction):
        """Plans and writes, then another compaction runs whole before this one creates its record."""

        def _plan_and_write(self, *args: Any) -> Any:
            made = super()._plan_and_write(*args)
            assert Compaction(opts).compact().compaction == 1
            return made

    loser = Overtaken(opts)
    try:
        loser.compact()
        raise AssertionError("the second compaction of record 1 won too")
    except SlotBusyError as exc:
        assert "compaction record 1" in exc.message
    assert CompactionLog(open_output_path(out)).head() == 1 and staged(out) == []  # the loser's files removed
    assert changes(out) == before == delta_changes(out)
    code, _summary, text = compact(out, "--grace", "0")
    assert code == 0, text
    assert changes(out) == before


def test_compaction_on_an_object_store(db: Any, s3_bucket: Any) -> None:
    """SeaweedFS: merged files uploaded in place under a manifest, the Delta version, sources deleted; exact."""
    from pgpoll.sink.stores.filesystem import open_output
    from tests.materialize.test_store_materialize import _state

    capture = make_capture(db, "pgoutput", s3_bucket.child("out"))  # type: ignore[arg-type]
    out = capture.output
    workload(capture, 1)
    before = changes(out)
    fs = open_output(out)

    def data_files() -> int:
        return sum(1 for name, is_dir, _s in fs.list(fs.path("changes")) if is_dir and name.startswith("lsn_range=")
                   for _f in fs.list(fs.path("changes", name)))

    files_before = data_files()
    code, summary, text = compact(out, "--grace", "0")
    assert code == 0 and summary is not None and summary["merges"] == 1 and summary["deleted_partitions"] > 0, text
    assert data_files() < files_before and data_files() <= 2  # the merge and the newest record's (SeaweedFS may list
    # a deleted partition's empty directory for a while)
    assert changes(out) == before
    assert sorted(zip(*(read_delta(fs.path("changes"), fs=open_output(fs.path("changes"))).column(c).to_pylist()
                        for c in ("commit_lsn", "seq", "op")), strict=True)) == before
    dest = s3_bucket.child("state")
    result = CliRunner().invoke(cli, ["materialize", "--output", out, "--to", dest, "--format", "delta", "--json"])
    assert result.exit_code == 0, result.output
    assert [tuple(r.values()) for r in _state(dest)] == source(capture)
