"""Routine runs cost the same store requests on a long history as on a short one (SeaweedFS behind the counting
proxy): an incremental ``materialize``, an ``ingest`` run and ``status --output`` at N and at ten times N batches.

The history is real batches with rows (``ingest --batch-changes``) and, to make it long fast, heartbeat
batches: records of ranges of WAL that hold no captured change (rows written to a table outside the
publication), created with the commit log's own compare-and-set and checkpointed as the publisher does.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.log import CHECKPOINT_EVERY, VERSION, CommitLog, CommitRecord
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from pgpoll.testing.pytest_plugin import store_server
from pgpoll.testing.store_proxy import StoreProxy
from tests.ingest.conftest import Capture, ingest, make_capture
from tests.materialize.test_store_materialize import _state

READS = ("GET", "LIST", "HEAD")


@pytest.fixture
def proxy(s3_bucket: StoreBucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreProxy]:
    """The counting proxy in front of the test S3 store, its address set as the endpoint."""
    started = StoreProxy("127.0.0.1", store_server("seaweedfs").port).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", started.url)
    try:
        yield started
    finally:
        started.stop()


def _pad(capture: Capture, until: int) -> None:
    """Heartbeat batches up to record ``until``, over WAL written to a table the publication leaves out."""
    db = capture.db
    db.execute("INSERT INTO other SELECT g, 'x' FROM generate_series(1, 200) g ON CONFLICT (id) DO UPDATE SET v = 'y'")
    top = int(Lsn.parse(db.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
    log = CommitLog(open_output(capture.output))
    state = log.state()
    hwm = int(state.high_water_mark or 0)
    count = until - state.head
    assert top - hwm > count
    for i in range(1, count + 1):
        seq, end = state.head + i, str(Lsn(hwm + i * ((top - hwm) // count)))
        record = CommitRecord(start=end, end=end, rows=0, files=[], partition=None, slot=capture.slot,
                              plugin=capture.plugin, version=VERSION, seq=seq, prev=seq - 1, run="pad")
        assert log.create(record)
        if seq % CHECKPOINT_EVERY == 0:
            log.write_checkpoint(log.state(), seq, "pad")


def _costs(proxy: StoreProxy, capture: Capture, dest: str) -> dict[str, Counter[str]]:
    """Requests of one routine round: 5 rows updated, ingest, an incremental materialize, status."""
    db = capture.db
    db.execute("UPDATE items SET v = v || '+' WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 5)")
    out: dict[str, Counter[str]] = {}
    proxy.reset()
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    out["ingest"] = proxy.reset()
    result = CliRunner().invoke(cli, ["materialize", "--output", capture.output, "--to", dest, "--format", "delta",
                                      "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [(s["mode"], s["batches"]) for s in lines if "table" in s] == [("incremental", 1)], result.output
    out["materialize"] = proxy.reset()
    status = CliRunner().invoke(cli, ["status", "--output", capture.output, "--slot", capture.slot, "--json"],
                                env={"PGPOLL_DSN": db.dsn})
    assert status.exit_code == 0, status.output
    out["status"] = proxy.reset()
    return out


def test_routine_runs_read_the_same_at_n_and_at_ten_times_n_batches(
    db: Any, s3_bucket: StoreBucket, proxy: StoreProxy
) -> None:
    capture = make_capture(db, "pgoutput", s3_bucket.child("out"))  # type: ignore[arg-type]
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 40) g")
    assert ingest(db.dsn, *capture.args("--typed-tables", "--batch-changes", "4")).exit_code == 0  # 10 real batches
    small, large = 100, 1000
    seen: dict[int, dict[str, Counter[str]]] = {}
    for size in (small, large):
        _pad(capture, size - 1)  # the round's ingest writes record ``size``
        dest = s3_bucket.child(f"state-{size}")  # a new state each time: its Delta log as long at N as at 10N
        result = CliRunner().invoke(cli, ["materialize", "--output", capture.output, "--to", dest, "--format",
                                          "delta", "--json"])
        assert result.exit_code == 0, result.output
        seen[size] = _costs(proxy, capture, dest)  # after the heartbeats: they are never read
        assert _state(dest) == [{"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM items ORDER BY id")]
    for command in ("ingest", "materialize", "status"):
        at_n, at_10n = seen[small][command], seen[large][command]
        for kind in READS:
            assert abs(at_10n[kind] - at_n[kind]) <= max(2, 0.2 * at_n[kind]), (command, kind, at_n, at_10n)
    assert CommitLog(open_output(capture.output)).state().head == large
