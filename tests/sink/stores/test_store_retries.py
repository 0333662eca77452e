"""A store that throttles (S3's ``503 SlowDown``, through a proxy in front of SeaweedFS): operations are retried with
backoff, each retry logged, and an ingest run through it commits every change once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pgpoll.reader import read_changes_arrow
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from pgpoll.testing.pytest_plugin import store_server
from pgpoll.testing.store_proxy import StoreProxy
from tests.ingest.conftest import ingest, make_capture


@pytest.fixture
def throttling(s3_bucket: StoreBucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreProxy]:
    """A proxy in front of the test S3 store, its address set as the endpoint."""
    proxy = StoreProxy("127.0.0.1", store_server("seaweedfs").port).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        yield proxy
    finally:
        proxy.stop()


def test_throttled_operations_are_retried_and_logged(
    s3_bucket: StoreBucket, throttling: StoreProxy, caplog: pytest.LogCaptureFixture
) -> None:
    fs = open_output(s3_bucket.url)
    throttling.throttle(10)  # more than the client's own retries of one request: pgpoll's retries are seen
    with caplog.at_level(logging.WARNING, logger="pgpoll.sink"):
        assert fs.create_exclusive(fs.path("_pgpoll", "commits", "seq-1.json"), '{"run": "a"}') is True
        fs.write_text(fs.path("_pgpoll", "lease.json"), "{}")
        assert len(fs.list(fs.path("_pgpoll"))) == 2
    assert throttling.throttled == 10
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries and all("S3" in m and "attempt" in m for m in retries)
    assert fs.read_text(fs.path("_pgpoll", "commits", "seq-1.json")) == '{"run": "a"}'


def test_an_ingest_run_through_a_throttling_store_commits_every_change_once(
    db: Any, s3_bucket: StoreBucket, throttling: StoreProxy, caplog: pytest.LogCaptureFixture
) -> None:
    capture = make_capture(db, "pgoutput", s3_bucket.child("out"))  # type: ignore[arg-type]
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")
    throttling.throttle(12)
    with caplog.at_level(logging.WARNING, logger="pgpoll.sink"):
        result = ingest(db.dsn, *capture.args("--batch-changes", "200", "--typed-tables"))
    assert result.exit_code == 0, result.stderr
    assert throttling.throttled == 12 and any("retrying in" in r.getMessage() for r in caplog.records)
    changes = read_changes_arrow(capture.output)
    ids = sorted(int(dict(a)["id"]) for a in changes.column("after").to_pylist())
    assert ids == list(range(1, 501))
