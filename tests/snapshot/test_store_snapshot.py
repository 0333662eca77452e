"""``pgpoll snapshot`` into an object store (SeaweedFS): the chunk tasks write their files once at their final keys,
the manifests name them, and materialize builds the state on the snapshot from the store."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.sink.snapshot_store import latest_complete
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from tests.materialize.test_store_materialize import _state


def _cli(dsn: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = CliRunner().invoke(cli, list(args), env={"PGPOLL_DSN": dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")], result.output


def test_a_snapshot_on_s3_and_the_state_built_on_it(db: Any, s3_bucket: StoreBucket, spark: Any) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("ALTER TABLE items ALTER COLUMN v SET STORAGE PLAIN")  # (chunked under today's rule)
    db.execute("INSERT INTO items SELECT g, 'before' || g FROM generate_series(1, 600) g")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE items")
    db.execute("UPDATE items SET v = 'after' WHERE id % 50 = 0")
    db.execute("INSERT INTO items SELECT g, 'new' FROM generate_series(601, 650) g")
    out = s3_bucket.child("out")
    args = ["--slot", slot, "--publication", "p", "--output", out]
    code, _lines, text = _cli(db.dsn, "ingest", *args, "--typed-tables")
    assert code == 0, text
    code, lines, text = _cli(db.dsn, "snapshot", *args, "--chunk-rows", "100", "--parallelism", "2", "--json")
    assert code == 0, text
    summary = lines[-1]
    assert summary["status"] == "ok" and summary["rows"] == 650 and summary["chunks"] >= 4
    found = latest_complete(open_output(out), "public", "items")
    assert found is not None and len(found.chunk_paths()) == summary["chunks"]
    assert all("/chunk=" in p and "/_attempts/" not in p for p in found.chunk_paths())  # checkout-paths: data
    fs = open_output(out)
    assert all(fs.exists(p) for p in found.chunk_paths())
    dest = s3_bucket.child("state")
    code, tables, text = _cli(db.dsn, "materialize", "--output", out, "--to", dest, "--format", "delta", "--json")
    assert code == 0, text
    assert [t["snapshot"]["complete"] for t in tables if "table" in t] == [True]
    assert _state(dest) == [{"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM items ORDER BY id")]
