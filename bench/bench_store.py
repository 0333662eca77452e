"""Benchmark: a backlog drained to an object store (SeaweedFS, S3's API) against the same drain to a local disk.

Side by side on one throwaway server, ``--repeat`` times each: a real
``jobs/ingest.py`` process with the options users run (none but the slot and
output) draining the same backlog, once into a local directory and once into
``s3://`` on a SeaweedFS started here, each followed by an empty run on the
drained slot. Prints medians and the ratio (S3 drain - its empty run) /
(local drain - its empty run). Once more, untimed, through a request-counting
proxy (:mod:`pgpoll.testing.store_proxy`): the requests a batch costs on the
store (PUT, GET, HEAD, LIST, DELETE per committed batch, empty runs included).

    python bench/bench_store.py [--changes 1000000] [--repeat 3] [--txn-rows 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg2

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs
from pgpoll.testing.object_stores import SeaweedFs
from pgpoll.testing.store_proxy import StoreProxy

REPO = Path(__file__).resolve().parents[1]


def _sql(conn: Any, query: str, params: Any = None) -> None:
    with conn.cursor() as cur:
        cur.execute(query, params)


def _ingest(dsn: str, slot: str, output: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    args = [sys.executable, str(REPO / "jobs" / "ingest.py"), "--slot", slot, "--output", output, "--publication", "bench_pub"]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **env, "PGPOLL_DSN": dsn})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--txn-rows", type=int, default=10_000)
    opts = parser.parse_args()
    installs = find_bindirs()
    cluster = ThrowawayCluster(installs[15] if 15 in installs else installs[max(installs)]).start()
    store = SeaweedFs().start()
    proxy = StoreProxy("127.0.0.1", store.port).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-store-"))
    s3_env = store.env()
    counted_env = {**store.env(), "AWS_ENDPOINT_URL": proxy.url}
    store.create_bucket("bench")
    runs: list[dict[str, float]] = []
    requests: dict[str, int] = {}
    batches = 0
    try:
        dsn = cluster.dsn("postgres")
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        _sql(conn, "CREATE TABLE bench (id bigint PRIMARY KEY, a bigint, b text, c numeric, d timestamptz)")
        _sql(conn, "CREATE PUBLICATION bench_pub FOR TABLE bench")
        for run in range(opts.repeat):
            slots = {kind: f"bench_{kind}_{run}" for kind in ("local", "s3", "counted")}
            for slot in slots.values():
                _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            _sql(conn, "TRUNCATE bench")
            for lo in range(0, opts.changes, opts.txn_rows):
                _sql(conn, "INSERT INTO bench SELECT g, g * 2, 'name-' || g, g * 1.5, now() "
                           "FROM generate_series(%s, %s) g", (lo, min(lo + opts.txn_rows, opts.changes) - 1))
            figures: dict[str, float] = {}
            local_out = str(work / f"local-{run}")
            s3_out = f"s3://bench/{uuid.uuid4().hex[:8]}/out"
            figures["local_drain"], _summary = _ingest(dsn, slots["local"], local_out, {})
            figures["local_empty"], _summary = _ingest(dsn, slots["local"], local_out, {})
            figures["s3_drain"], _summary = _ingest(dsn, slots["s3"], s3_out, s3_env)
            figures["s3_empty"], _summary = _ingest(dsn, slots["s3"], s3_out, s3_env)
            if run == 0:  # the same drain and empty run again, through the counting proxy (not timed)
                proxy.reset()
                counted = f"s3://bench/{uuid.uuid4().hex[:8]}/out"
                _seconds, summary = _ingest(dsn, slots["counted"], counted, counted_env)
                _seconds, empty = _ingest(dsn, slots["counted"], counted, counted_env)
                requests = dict(proxy.reset())
                batches = int(summary["batches"]) + int(empty["batches"])
            figures["ratio"] = (figures["s3_drain"] - figures["s3_empty"]) / (figures["local_drain"] - figures["local_empty"])
            runs.append(figures)
            print(json.dumps({"run": run, **{k: round(v, 3) for k, v in figures.items()}}), flush=True)
            for slot in slots.values():
                _sql(conn, "SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.close()
    finally:
        proxy.stop()
        store.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)  # the local outputs (about 80 MB a run)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(f"\n{opts.changes:,} changes in {opts.txn_rows:,}-row transactions, pgoutput, default options, "
          f"medians of {opts.repeat} runs:")
    print("| output | drain | empty run | drain - empty |")
    print("|---|---|---|---|")
    for kind, name in (("local", "local disk"), ("s3", "S3 (SeaweedFS on loopback)")):
        print(f"| {name} | {median(kind + '_drain'):.2f} s | {median(kind + '_empty'):.2f} s | "
              f"{median(kind + '_drain') - median(kind + '_empty'):.2f} s |")
    print(f"\n(S3 drain - empty) / (local drain - empty): {median('ratio'):.2f}x (median of per-run ratios)")
    per_batch = {k: round(v / max(batches, 1), 1) for k, v in sorted(requests.items())}
    print(f"requests per batch on the store ({batches} batches, empty runs included): {per_batch}")


if __name__ == "__main__":
    main()
