"""Bad object-store settings: a wrong secret, a missing bucket, a stopped store. Every command exits 5 within
seconds with one line naming the store, the path and the variable to fix; nothing is written, the slot stays,
and no secret appears anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from pgpoll.testing.cluster import free_port
from pgpoll.testing.object_stores import SECRET_KEY, StoreBucket
from pgpoll.testing.pytest_plugin import store_server

CASES = ["wrong secret", "missing bucket", "stopped store"]


def _case(case: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, StoreBucket]:
    """(output, what the message must name, the store) for one kind of bad setting.

    SeaweedFS checks signatures (moto's server does not); moto, like S3, has no bucket until one is created
    (SeaweedFS creates one on a first write by its admin).
    """
    server = store_server("seaweedfs" if case == "wrong secret" else "moto")
    bucket = server.bucket("lake")
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    if case == "wrong secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY + "-wrong")
        return bucket.url, "AWS_SECRET_ACCESS_KEY", bucket
    if case == "missing bucket":
        return bucket.url.replace("s3://lake/", "s3://no-such-bucket/"), "no-such-bucket", bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    return bucket.url, "AWS_ENDPOINT_URL", bucket


def _pgpoll(dsn: str, *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    env = {**os.environ, "PGPOLL_DSN": dsn}
    proc = subprocess.run([sys.executable, "-m", "pgpoll", *args], capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def _keys(bucket: StoreBucket) -> list[str]:
    from pgpoll.sink.stores.filesystem import open_output

    with pytest.MonkeyPatch.context() as patch:
        for name, value in bucket.env.items():
            patch.setenv(name, value)
        fs = open_output(bucket.url)
        return [name for name, _size in fs.list_files(fs.root)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", CASES)
def test_ingest_snapshot_materialize_and_status_exit_5_at_once_and_write_nothing(
    case: str, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE items")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    before = db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    output, named, bucket = _case(case, monkeypatch)
    for args in (["ingest", "--slot", slot, "--publication", "p", "--output", output],
                 ["snapshot", "--slot", slot, "--publication", "p", "--output", output],
                 ["materialize", "--output", output, "--to", output + "/state", "--format", "delta"],
                 ["status", "--slot", slot, "--output", output], ["batches", "--output", output]):
        code, text, seconds = _pgpoll(db.dsn, *args)
        assert code == 5, f"{args[0]}: {text}"
        assert seconds < 20, f"{args[0]} took {seconds:.1f} s"
        assert named in text and "fix:" in text, f"{args[0]}: {text}"
        assert SECRET_KEY not in text and "Traceback" not in text
    after = db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    assert after == before
    assert _keys(bucket) == []  # nothing written (the bucket the settings would have reached is still empty)
