"""``pgpoll retain`` on an S3 output (SeaweedFS): the batches' keys, the Delta table's files and the records go,
the destination that is behind holds the rest, and the state goes on equal to the source. No JVM: the table
has no snapshot, so materialize computes it in the driver."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.reader import read_changes_arrow
from pgpoll.sink import layout
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from tests.ingest.conftest import ingest, make_capture
from tests.materialize.conftest import materialize


def kept_partition(fs: Any, seq: int) -> str:
    """The partition of the first record with rows from ``seq`` on."""
    log = CommitLog(fs)
    while not log.read(seq).partition:
        seq += 1
    return str(log.read(seq).partition)


def _cli(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = CliRunner().invoke(cli, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")], result.stderr


def test_retention_on_s3_removes_the_keys_and_delta_files_and_keeps_what_the_destination_needs(
    db: Any, s3_bucket: StoreBucket
) -> None:
    cap = make_capture(db, "pgoutput", s3_bucket.child("out"))  # type: ignore[arg-type]
    for i in range(1, 6):
        db.execute(f"INSERT INTO items VALUES ({i}, 'a{i}')")
    assert ingest(db.dsn, *cap.args("--typed-tables", "--batch-changes", "1")).exit_code == 0
    dest = s3_bucket.child("state")
    assert materialize(cap.output, "--to", dest, "--format", "delta")[0] == 0
    for i in range(1, 4):
        db.execute(f"UPDATE items SET v = 'b{i}' WHERE id = {i}")
    assert ingest(db.dsn, *cap.args("--typed-tables", "--batch-changes", "1")).exit_code == 0
    fs = open_output(cap.output)
    before = CommitLog(fs).state().head

    code, out, err = _cli("retain", "--output", cap.output, "--retention", "0", "--json")

    assert code == 0, err
    summary = out[-1]
    assert len(summary["partitions"]) == 5, summary  # the inserts' batches (and any heartbeat): the destination has them
    assert any(dest in h for h in summary["held_by"]) and "public.items has no complete snapshot" in err
    table_dir = fs.path(layout.TABLES, layout.table_dir_name("public", "items"))
    for partition in summary["partitions"]:  # no key left under them (SeaweedFS may still list the empty prefix)
        assert fs.list(fs.path(layout.CHANGES, partition)) == [] and fs.list(f"{table_dir}/{partition}") == []
    assert fs.list(fs.path(layout.CHANGES, kept_partition(fs, summary["floor"] + 1)))  # the kept ones are there
    kept = [CommitLog(fs).read(s) for s in range(summary["floor"] + 1, before + 1)]
    assert read_changes_arrow(cap.output).num_rows == sum(r.rows for r in kept) == 3  # the Delta table's files
    code, rows, _ = _cli("batches", "--output", cap.output, "--json")
    assert code == 0 and [r["seq"] for r in rows if "seq" in r] == [r.seq for r in kept]

    assert materialize(cap.output, "--to", dest, "--format", "delta")[0] == 0  # behind the head, not the floor
    state = read_delta(f"{dest}/{layout.table_dir_name('public', 'items')}").to_pylist()
    assert sorted((r["id"], r["v"]) for r in state) == [tuple(r) for r in db.execute("SELECT id, v FROM items ORDER BY id")]
    code, tables, err = materialize(cap.output, "--to", s3_bucket.child("new"), "--format", "delta")
    assert code == 2 and tables[0]["mode"] == "refused" and "pgpoll snapshot --tables public.items" in err
