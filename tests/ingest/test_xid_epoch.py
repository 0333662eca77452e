"""Full 64-bit transaction ids on a server whose xid epoch is not 0 (set with pg_resetwal).

Logical decoding prints 32-bit ids; below epoch 1 they equal the full ids, so
only a server past a wraparound proves the ingest widens them: the stored
``xid`` and typed ``_xid`` must be ``pg_current_xact_id()`` of the writer, and
the commit log's ``xid_min``/``xid_max`` their range.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow.parquet as pq
import pytest

from pgpoll.sink.layout import table_dir_name
from pgpoll.testing.cluster import ThrowawayCluster, as_server_user, find_bindirs
from tests.ingest.conftest import ingest

EPOCH = 7
#: the first id of pg_xact segment 0001: pg_resetwal's documented safe choice past initdb's few hundred ids
NEXT_XID = 0x100000


@pytest.fixture(scope="module")
def epoch_cluster() -> Iterator[ThrowawayCluster]:
    """A throwaway PostgreSQL 15 whose next transaction id is in epoch 7."""
    installation = find_bindirs().get(15)
    if installation is None or not (installation.bindir / "pg_resetwal").exists():
        pytest.skip("needs PostgreSQL 15 server binaries with pg_resetwal")
    cluster = ThrowawayCluster(installation).start()
    try:
        def run(program: str, *args: str) -> None:
            subprocess.run([*as_server_user(), str(installation.bindir / program), *args],
                           check=True, capture_output=True, text=True, timeout=60)

        run("pg_ctl", "-D", str(cluster.datadir), "-m", "fast", "-w", "-t", "60", "stop")
        run("pg_resetwal", "-e", str(EPOCH), "-x", str(NEXT_XID), "-D", str(cluster.datadir))
        cluster.start_server()
        yield cluster
    finally:
        cluster.stop()


def _write(conn: Any, statements: list[str]) -> int:
    """Run ``statements`` in one transaction; returns its pg_current_xact_id()."""
    with conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
        cur.execute("SELECT pg_current_xact_id()::text")
        row = cur.fetchone()
        assert row is not None
        return int(row[0])


def test_stored_ids_are_the_writers_full_ids_past_epoch_0(epoch_cluster: ThrowawayCluster, spark: Any, tmp_path: Path) -> None:
    dsn = epoch_cluster.dsn()
    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
            row = cur.fetchone()
            assert row is not None and int(row[0]) >> 32 == EPOCH  # the server is past epoch 0
            cur.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
            cur.execute("CREATE PUBLICATION p FOR TABLE acct")
            cur.execute("SELECT 1 FROM pg_create_logical_replication_slot('epoch', 'pgoutput')")
        conn.autocommit = False
        writers = {
            _write(conn, ["INSERT INTO acct VALUES (1, 'a'), (2, 'b')"]): {1, 2},
            # a subtransaction's change belongs to the top-level transaction, whose id the writer sees
            _write(conn, ["SAVEPOINT s", "INSERT INTO acct VALUES (3, 'c')", "RELEASE SAVEPOINT s",
                          "UPDATE acct SET v = 'z' WHERE id = 1"]): {3, 1},
            _write(conn, ["DELETE FROM acct WHERE id = 2"]): {2},
        }
    finally:
        conn.close()
    assert all(x >> 32 == EPOCH for x in writers)
    out = tmp_path / "out"

    result = ingest(dsn, "--slot", "epoch", "--publication", "p", "--output", str(out), "--typed-tables")

    assert result.exit_code == 0, result.stderr
    envelope = pq.read_table(out / "changes").to_pylist()
    typed = pq.read_table(out / "tables" / table_dir_name("public", "acct")).to_pylist()
    stored = {(r["xid"], int(dict(r["after"] or r["before"])["id"])) for r in envelope}
    assert stored == {(xid, i) for xid, ids in writers.items() for i in ids}
    assert sorted((r["_xid"], r["id"]) for r in typed) == sorted(stored)
    records = [json.loads(p.read_text()) for p in sorted((out / "_pgpoll" / "commits").glob("*.json"))]
    [batch] = [r for r in records if r["rows"]]
    assert batch["xid_min"] == min(writers) and batch["xid_max"] >= max(writers)
    # the run's heartbeat is a transaction of its last batch (taken in by the batch whose peek read to the end of
    # WAL, here the one with the rows): its full id, past the writers', is that batch's xid_max
    heartbeat = records[-1]
    assert heartbeat["xid_max"] > max(writers) and heartbeat["xid_max"] >> 32 == EPOCH
