"""``pgpoll ingest`` into an object store (SeaweedFS): no JVM, the files written once at their final keys, fenced,
the change log readable as a Delta table, and no local spill left behind, even by a killed run."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes, read_changes_arrow
from pgpoll.sink.change_table import APP_ID, ChangeTable
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.sink.stores.uploads import SPILL_PREFIX, spill_prefix
from pgpoll.testing.object_stores import SECRET_KEY, StoreBucket
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, ingest_process, make_capture
from tests.ingest.test_fencing import reaped, start_job


def test_changes_land_on_s3_once_fenced_and_listed_by_the_delta_log(
    capture: Capture, s3_bucket: StoreBucket, spark: Any
) -> None:
    capture.output = s3_bucket.url
    db = capture.db
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 250) g")
    db.execute("UPDATE items SET v = 'changed' WHERE id <= 10")
    db.execute("DELETE FROM items WHERE id > 240")

    result = ingest(db.dsn, *capture.args("--batch-changes", "100", "--typed-tables"))

    assert result.exit_code == 0, result.stderr
    summary = result.summary
    assert summary is not None and summary["status"] == "ok" and summary["changes"] == 270
    assert summary["fenced"] is True and summary["spark_jobs"] == 0 and summary["batches"] >= 3
    assert SECRET_KEY not in result.stdout + result.stderr
    rows = read_changes_arrow(s3_bucket.url).sort_by([("commit_lsn", "ascending"), ("seq", "ascending")]).to_pylist()
    assert [r["op"] for r in rows].count("I") == 250 and len(rows) == 270
    assert len({(r["commit_lsn"], r["seq"]) for r in rows}) == 270
    fs = open_output(s3_bucket.url)
    records = CommitLog(fs).records()
    assert all(r.in_place for r in records if r.partition) and Lsn.parse(confirmed_lsn(db, capture.slot)) == records[-1].end_lsn
    table = ChangeTable(fs)
    dt = DeltaTable(table.uri or "", storage_options=table.options)
    assert dt.transaction_version(APP_ID) == max(r.seq for r in records if r.partition)
    assert dt.version() == len([r for r in records if r.partition]) - 1  # one version per batch with rows
    listed = {u.rsplit("/changes/", 1)[1] for u in dt.file_uris()}  # checkout-paths: data
    assert listed == {f"{r.partition}/{f}" for r in records if r.partition for f in r.files}
    frame = read_changes(spark, s3_bucket.url)  # Spark without any Hadoop connector
    assert frame.count() == 270 and frame.where("op = 'D'").count() == 10

    again = ingest(db.dsn, *capture.args("--typed-tables"))
    assert again.exit_code == 0 and again.summary is not None and again.summary["changes"] == 0


def test_a_run_killed_while_spilling_leaves_its_spill_and_the_next_run_removes_it(
    db: Any, s3_bucket: StoreBucket, tmp_path: Path
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "unused")
    capture.output = s3_bucket.url
    for first in (1, 100_001, 200_001):
        db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (first, first + 99_999))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    job = start_job(db.dsn, capture.args("--batch-changes", "100000"), tmp_path / "killed.log", env=env)
    with reaped([job]):
        deadline = time.monotonic() + 120
        spills: list[Path] = []
        while not spills and job.proc.poll() is None and time.monotonic() < deadline:
            spills = [p for p in temp.iterdir() if p.name.startswith(spill_prefix())]
            time.sleep(0.01)
        job.kill()
        assert job.wait() == -signal.SIGKILL, job.stderr()
    assert len(spills) == 1 and spills[0].exists(), "the killed run's spill directory is left behind"

    result = ingest_process(db.dsn, *capture.args("--batch-changes", "100000"), env=env)

    assert result.exit_code == 0, result.stderr
    assert not spills[0].exists() and not [p for p in temp.iterdir() if p.name.startswith(SPILL_PREFIX)]
    ids = read_changes_arrow(s3_bucket.url).column("after").to_pylist()
    assert sorted(int(dict(a)["id"]) for a in ids) == list(range(1, 300_001))
