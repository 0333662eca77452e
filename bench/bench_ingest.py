"""Benchmark: drain a backlog end to end and compare with the server's own decode time.

Prints, from one run on one throwaway server: the server's decode time
(``count(*)`` over the same peek), ``pg_recvlogical`` writing the same backlog
to a file, pgpoll end to end (a real ``jobs/ingest.py`` process, its own Spark),
pgpoll's time for an empty run (Spark start-up, subtracted), the ratio to the
server, and the batch task's peak memory for one 200k-row and one 2M-row
transaction. Goals (issue 4): end to end within 1.5x the server's decode time;
peak memory for the 2M-row transaction at most 1.25x that of the 200k-row one.

    python bench/bench_ingest.py [--changes 1000000] [--plugin pgoutput] [--skip-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

REPO = Path(__file__).resolve().parents[1]


def _sql(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def _ingest(dsn: str, slot: str, output: str, plugin: str, batch: int) -> tuple[float, dict[str, Any]]:
    args = [sys.executable, str(REPO / "jobs" / "ingest.py"), "--slot", slot, "--output", output, "--batch-changes", str(batch)]
    if plugin == "pgoutput":
        args += ["--publication", "bench_pub"]
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def _slot(conn: Any, name: str, plugin: str) -> None:
    _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (name, plugin))


def _fresh_table(conn: Any) -> None:
    """The 5-column table ``bench`` and its publication, new and empty."""
    _sql(conn, "DROP TABLE IF EXISTS bench; CREATE TABLE bench (id bigint PRIMARY KEY, a bigint, b text, c numeric, d timestamptz)")
    _sql(conn, "DROP PUBLICATION IF EXISTS bench_pub; CREATE PUBLICATION bench_pub FOR TABLE bench")


def _fill(conn: Any, rows: int, per_txn: int, start: int = 0) -> None:
    for lo in range(start, start + rows, per_txn):
        hi = min(lo + per_txn, start + rows) - 1
        _sql(conn, "INSERT INTO bench SELECT g, g * 2, 'name-' || g, g * 1.5, now() FROM generate_series(%s, %s) g", (lo, hi))


def measure_backlog(cluster: ThrowawayCluster, changes: int, plugin: str, work: Path, run: int = 0) -> dict[str, Any]:
    """Server decode, pg_recvlogical and pgpoll end to end on one backlog (``run`` keeps slot names apart)."""
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    tag = f"{plugin[:2]}{changes}r{run}"
    for name in (f"srv_{tag}", f"rcv_{tag}", f"pgp_{tag}", f"nil_{tag}"):
        _slot(conn, name, plugin)
    _sql(conn, "SELECT pg_drop_replication_slot(%s)", (f"nil_{tag}",))
    _fill(conn, changes, 10_000)
    _slot(conn, f"nil_{tag}", plugin)  # an empty slot: measures a run with nothing to do
    end_lsn = _sql(conn, "SELECT pg_current_wal_lsn()::text")[0][0]

    if plugin == "pgoutput":
        peek = "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true')"
    else:
        peek = "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, 'include-xids', '1', 'include-timestamp', '1')"
    started = time.perf_counter()
    rows = _sql(conn, peek, (f"srv_{tag}",))[0][0]
    server_s = time.perf_counter() - started

    recv = shutil.which("pg_recvlogical", path=str(cluster.installation.bindir)) or shutil.which("pg_recvlogical")
    recv_s = None
    if recv:
        cmd = [recv, "-d", dsn, "--slot", f"rcv_{tag}", "--start", "--endpos", end_lsn, "--no-loop", "-f", str(work / f"{tag}.out")]
        if plugin == "pgoutput":
            cmd += ["-o", "proto_version=1", "-o", "publication_names=bench_pub"]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        recv_s = time.perf_counter() - started

    empty_s, _ = _ingest(dsn, f"nil_{tag}", str(work / f"nil_{tag}"), plugin, changes * 3)
    full_s, summary = _ingest(dsn, f"pgp_{tag}", str(work / f"pgp_{tag}"), plugin, changes * 3)
    for name in (f"srv_{tag}", f"rcv_{tag}", f"nil_{tag}", f"pgp_{tag}"):  # leave no slot pinning WAL for the next run
        _sql(conn, "SELECT pg_drop_replication_slot(%s)", (name,))
    conn.close()
    net = full_s - empty_s
    return {
        "plugin": plugin, "changes": changes, "peek_rows": rows, "server_s": server_s, "recvlogical_s": recv_s,
        "pgpoll_s": full_s, "pgpoll_empty_s": empty_s, "pgpoll_net_s": net, "ratio": net / server_s,
        "written": summary["changes"], "batch_s": summary["batch_seconds"],
    }


def measure_memory(cluster: ThrowawayCluster, rows: int, plugin: str, work: Path) -> int:
    """Peak RSS (kB) of the batch task for one transaction of ``rows`` rows."""
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    slot = f"mem_{plugin[:2]}_{rows}"
    _slot(conn, slot, plugin)
    _fill(conn, rows, rows)
    conn.close()
    _s, summary = _ingest(dsn, slot, str(work / slot), plugin, rows * 3)
    return int(summary["task_peak_rss_kb"])


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--plugin", choices=["pgoutput", "test_decoding"], default="pgoutput")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={"max_wal_size": "4GB", "work_mem": "64MB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-"))
    try:
        r = measure_backlog(cluster, args.changes, args.plugin, work)
        print(f"PostgreSQL {inst.version}, plugin {r['plugin']}, backlog {r['changes']:,} changes ({r['peek_rows']:,} peek rows)")
        print(f"  server decode (count(*) over the peek): {r['server_s']:.2f} s")
        if r["recvlogical_s"] is not None:
            print(f"  pg_recvlogical to a file:               {r['recvlogical_s']:.2f} s")
        print(f"  pgpoll end to end:                      {r['pgpoll_s']:.2f} s (empty run {r['pgpoll_empty_s']:.2f} s)")
        print(f"  pgpoll without Spark start-up:          {r['pgpoll_net_s']:.2f} s = {r['ratio']:.2f}x the server (goal <= 1.5x)")
        print(f"  pgpoll's own batch time (peek, decode, write, commit, advance): {r['batch_s']:.2f} s = "
              f"{r['batch_s'] / r['server_s']:.2f}x the server")
        print(f"  changes written: {r['written']:,}")
        if not args.skip_memory:
            small = measure_memory(cluster, 200_000, args.plugin, work)
            large = measure_memory(cluster, 2_000_000, args.plugin, work)
            print(f"  task peak RSS, one 200k-row transaction: {small / 1024:.0f} MiB; one 2M-row transaction: "
                  f"{large / 1024:.0f} MiB = {large / small:.2f}x (goal <= 1.25x)")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
