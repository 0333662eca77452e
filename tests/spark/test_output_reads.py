"""``spark.read.format("pgpoll").load(PATH)``: committed batches only, LSN ranges, typed tables, states; slot previews.

The expected answers come from pgpoll's other readers of the same output
(:func:`pgpoll.reader.read_changes`, Spark's ``mergeSchema`` read of a typed
table, pyarrow over a state's files), so these tests hold the data source to
what the output contract already says. Files are read with pyarrow inside the
tasks; what a plain Spark read of the directories would also pick up
(staging, a partition no record names) must not appear.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pgpoll.spark
from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes, read_changes_arrow
from pgpoll.sink import layout
from pgpoll.sink.change_table import committed_files
from pgpoll.sink.commit import batches, recovery
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.spark.source_options import parse_options
from pgpoll.testing.object_stores import StoreBucket
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize


@pytest.fixture
def pg(spark: Any) -> Any:
    pgpoll.spark.register(spark)
    return spark


def fill(db: Any, out: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Several ingest runs into ``out``, with typed tables and a commit-log checkpoint (every 3 records here)."""
    monkeypatch.setattr(batches, "CHECKPOINT_EVERY", 3)
    monkeypatch.setattr(recovery, "CHECKPOINT_EVERY", 3)
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(6,2))")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    for run in range(4):
        db.execute("INSERT INTO items SELECT g, 'v' || g, g / 4.0 FROM generate_series(%s, %s) g", (run * 50 + 1, run * 50 + 50))
        db.execute("UPDATE items SET v = v || '+' WHERE id %% 7 = %s", (run,))
        db.execute("INSERT INTO other VALUES (%s)", (run,))
        if run == 2:
            db.execute("ALTER TABLE items ADD COLUMN extra text")
            db.execute("DELETE FROM items WHERE id < 10")
            db.execute("INSERT INTO items (id, v, extra) VALUES (1000, 'x', 'new')")
        result = ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", "--batch-changes", "60")
        assert result.exit_code == 0, result.stderr
    assert CommitLog(open_output(out)).state().checkpoint is not None  # some partitions are folded, some are not
    return out


@pytest.fixture
def output(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local output of :func:`fill`."""
    return fill(db, str(tmp_path / "out"), monkeypatch)


def rows(frame: Any, *order: str) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in frame.orderBy(*order).collect()]


def test_the_change_log_is_what_read_changes_reads(pg: Any, output: str) -> None:
    frame = pg.read.format("pgpoll").load(output)
    expected = read_changes(pg, output)
    assert frame.schema == expected.schema
    assert rows(frame, "commit_lsn", "seq") == rows(expected, "commit_lsn", "seq")
    assert len(frame.collect()) > 250


def test_an_output_without_batches_reads_empty(pg: Any, tmp_path: Path) -> None:
    frame = pg.read.format("pgpoll").load(str(tmp_path / "nothing"))
    assert frame.collect() == [] and frame.schema == read_changes(pg, str(tmp_path / "nothing")).schema


def test_an_lsn_range_keeps_afterlsn_below_commit_lsn_up_to_uptolsn(pg: Any, output: str) -> None:
    commits = sorted({r.commit_lsn for r in read_changes(pg, output).select("commit_lsn").collect()})
    after, upto = commits[len(commits) // 4], commits[3 * len(commits) // 4]
    frame = (pg.read.format("pgpoll").option("afterLsn", str(Lsn(after))).option("uptoLsn", str(Lsn(upto)))
             .load(output))
    expected = read_changes(pg, output).where(f"commit_lsn > {after} AND commit_lsn <= {upto}")
    assert rows(frame, "commit_lsn", "seq") == rows(expected, "commit_lsn", "seq")
    assert 0 < frame.count() < read_changes(pg, output).count()


def test_a_typed_table_is_its_merged_files(pg: Any, output: str) -> None:
    frame = pg.read.format("pgpoll").option("table", "public.items").load(output)
    expected = pg.read.option("mergeSchema", "true").parquet(f"{output}/tables/public.items").drop("lsn_range")
    assert {f.name: f.dataType for f in frame.schema} == {f.name: f.dataType for f in expected.schema}
    assert rows(frame, "_commit_lsn", "_seq") == rows(expected.select(*frame.columns), "_commit_lsn", "_seq")
    assert "extra" in frame.columns  # a column added later reads as null in earlier rows


def test_staged_unrecorded_and_not_yet_moved_files(pg: Any, db: Any, output: str) -> None:
    """Staging and a partition no record names are never read; a record whose files are still staged is."""
    [[slot]] = db.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")  # fill's
    def written() -> list[Any]:  # records after the newest checkpoint that wrote rows
        return [r for r in CommitLog(open_output(output)).state().tail if r.partition]

    while not written():
        db.execute("INSERT INTO items (id) SELECT max(id) + 1 FROM items")
        assert ingest(db.dsn, "--slot", slot, "--output", output, "--typed-tables").exit_code == 0
    before = rows(pg.read.format("pgpoll").load(output), "commit_lsn", "seq")
    changes = Path(output) / layout.CHANGES
    newest = written()[-1]
    assert newest.partition and newest.staging
    # the newest record's publisher died after winning, before moving its files: they are still staged
    (Path(output) / layout.STAGING).mkdir(parents=True, exist_ok=True)
    shutil.move(str(changes / newest.partition), str(Path(output) / layout.STAGING / newest.staging))
    # a losing run's staging, and a partition no record names (beside the committed ones)
    shutil.copytree(Path(output) / layout.STAGING / newest.staging, Path(output) / layout.STAGING / "loser")
    shutil.copytree(Path(output) / layout.STAGING / newest.staging, changes / "lsn_range=00000000FFFFFFF0-00000000FFFFFFFF")
    assert rows(pg.read.format("pgpoll").load(output), "commit_lsn", "seq") == before


def test_a_parquet_and_a_delta_state_read_as_their_files(pg: Any, output: str, tmp_path: Path) -> None:
    code, _tables, err = materialize(output, "--tables", "public.items")
    assert code == 0, err
    frame = pg.read.format("pgpoll").option("state", "public.items").load(output)
    files = sorted(p for p in (Path(output) / "state" / "public.items").glob("*.parquet"))
    expected = pa.concat_tables([pq.read_table(p) for p in files])
    assert sorted(frame.columns) == sorted(expected.column_names)
    assert sorted(r["id"] for r in frame.collect()) == sorted(expected.column("id").to_pylist())

    dest = tmp_path / "delta"
    code, _tables, err = materialize(output, "--tables", "public.items", "--format", "delta", "--to", str(dest))
    assert code == 0, err
    delta = pg.read.format("pgpoll").option("state", "public.items").option("stateDir", str(dest)).load(output)
    assert sorted(map(tuple, delta.select("id", "v", "extra").collect())) == sorted(
        map(tuple, frame.select("id", "v", "extra").collect()))
    assert delta.count() == 200 + 1 - 9


def test_a_slot_preview_reads_what_is_pending_and_leaves_the_slot(pg: Any, db: Any) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 300) g")
    db.execute("UPDATE items SET v = NULL WHERE id = 5")
    position = db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    preview = pg.read.format("pgpoll").option("slot", slot).option("dsn", db.dsn).option("publication", "pub").load()
    got = preview.collect()
    assert [r.op for r in got].count("I") == 300 and got[-1].op == "U" and got[-1].after["v"] is None
    assert preview.count() == 301  # again: nothing was consumed
    assert db.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == position
    typed = pg.read.format("pgpoll").option("slot", slot).option("dsn", db.dsn).option("publication", "pub").option(
        "table", "items").load()
    assert [(r.id, r.v, r._op) for r in typed.orderBy("_commit_lsn", "_seq").collect()][-2:] == [(300, "v300", "I"),
                                                                                                  (5, None, "U")]


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({}, False, "either a slot or an output path"),
    ({"slot": "s", "path": "/x"}, False, "not both"),
    ({"path": "/x"}, True, "reads a slot, not an output path"),
    ({"slot": "s", "maxRowsPerTrigger": "0"}, True, "must be positive"),
    ({"slot": "s", "maxRowsPerTrigger": "10"}, False, "does not apply to a batch read"),
    ({"path": "/x", "dsn": "host=h"}, False, "does not apply to an output path"),
    ({"path": "/x", "state": "t", "afterLsn": "0/1"}, False, "does not apply to a materialized state"),
    ({"path": "/x", "afterLsn": "0/5", "uptoLsn": "0/5"}, False, "is not after afterLsn"),
    ({"path": "/x", "tables": "public.items"}, False, "not what is read of an output path"),
    ({"path": "/x", "table": "public.items", "excludeTables": "public.o*"}, False, "not what is read of an output"),
    ({"slot": "s", "uptoLsn": "0/5"}, False, "does not apply to a batch read of a slot"),
    ({"slot": "s", "maxrowspertriger": "5"}, True, "unknown option"),
])
def test_options_that_cannot_work_are_refused_before_anything_runs(options: dict[str, str], streaming: bool,
                                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_options(options, streaming=streaming)


def test_options_are_matched_without_case_and_the_dsn_hides() -> None:
    opts = parse_options({"SLOT": "s", "MaxRowsPerTrigger": "7", "dsn": "host=h password=secretpw", "table": "A.b"},
                         streaming=True)
    assert (opts.slot, opts.max_rows, opts.table) == ("s", 7, ("a", "b"))
    assert "secretpw" not in repr(opts)


def test_an_object_store_output_reads_through_the_store_what_its_logs_name(
    pg: Any, db: Any, s3_bucket: StoreBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 (SeaweedFS, no Hadoop connector): the change log, a typed table and a Delta state read in the tasks
    through pgpoll's store client; a file at a final key that no log names (a crashed run's upload) is not read."""
    out = fill(db, s3_bucket.url, monkeypatch)
    # the tasks (and the source's planning) read the store's settings from their environment, which Spark's
    # Python workers take from the session's at registration (as spark.executorEnv.* on a cluster)
    for name, value in os.environ.items():
        if name.startswith("AWS_"):
            monkeypatch.setitem(pg.sparkContext.environment, name, value)
    pgpoll.spark.register(pg)
    expected = read_changes_arrow(out)
    fs = open_output(out)
    committed = fs.path(layout.CHANGES, *committed_files(fs)[0][:2])
    stray = fs.path(layout.CHANGES, committed_files(fs)[0][0], "part-stray.parquet")
    pq.write_table(pq.read_table(fs.arrow_path(committed), filesystem=fs.arrow()), fs.arrow_path(stray),
                   filesystem=fs.arrow())

    frame = pg.read.format("pgpoll").load(out)
    got = rows(frame, "commit_lsn", "seq")
    assert [(r["commit_lsn"], r["seq"]) for r in got] == sorted(
        zip(expected.column("commit_lsn").to_pylist(), expected.column("seq").to_pylist(), strict=True))
    assert len(got) == expected.num_rows > 250

    typed = pg.read.format("pgpoll").option("table", "public.items").load(out)
    items = [(r["commit_lsn"], r["seq"]) for r in expected.to_pylist() if r["table_name"] == "items"]
    assert sorted((r["_commit_lsn"], r["_seq"]) for r in typed.select("_commit_lsn", "_seq").collect()) == sorted(items)
    assert "extra" in typed.columns

    dest = f"{s3_bucket.url}/delta"
    code, _tables, err = materialize(out, "--tables", "public.items", "--format", "delta", "--to", dest)
    assert code == 0, err
    state = pg.read.format("pgpoll").option("state", "public.items").option("stateDir", dest).load(out)
    assert sorted(r["id"] for r in state.collect()) == sorted(r[0] for r in db.execute("SELECT id FROM items"))
    assert state.count() == 200 + 1 - 9
