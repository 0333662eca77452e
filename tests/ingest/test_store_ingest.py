"""``pgpoll ingest`` into an object store (SeaweedFS): no JVM, the files written once at their final keys, fenced,
and the change log readable as a Delta table."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes, read_changes_arrow
from pgpoll.sink.change_table import APP_ID, ChangeTable
from pgpoll.sink.commit_log import CommitLog
from pgpoll.sink.filesystem import open_output
from pgpoll.testing.object_stores import SECRET_KEY, StoreBucket
from tests.ingest.conftest import Capture, confirmed_lsn, ingest


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
