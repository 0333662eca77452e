"""Benchmark: what ``--typed-tables`` adds to an ingest, and materialize full vs incremental.

On one throwaway server and one SparkSession (in-process, so Spark start-up
is not counted; a small warm-up ingest and materialize run first), for each
plugin and a backlog of N changes to a table with typed columns (bigint key,
bigint, text, numeric(12,2), timestamptz, boolean) in 10,000-row
transactions:

1. ``pgpoll ingest`` of the backlog without and with ``--typed-tables`` (two
   slots created before the workload, so both see the same changes) — seconds
   and the ratio typed / plain (the extra Spark job per table per batch);
2. ``pgpoll materialize`` (full, the first run) on the typed output; then
   N/10 UPDATEs are ingested and materialized incrementally, and the same data
   rebuilt with ``--full`` — seconds and the ratio incremental / full. Each
   materialize run also lists its Spark jobs by call site (from the Spark UI's
   REST API, when it is up), the rest being the driver's own time.

Figures only; nothing is asserted.

    python bench/bench_typed.py [--changes 100000] [--plugin pgoutput|test_decoding]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg2
from bench_ingest import _fill, _fresh_table, _slot, _sql

from pgpoll.ingest.run import IngestOptions, RunSummary, run_ingest
from pgpoll.materialize.run import MaterializeOptions, TableState, run_materialize
from pgpoll.spark.session import spark_session
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

PER_TXN = 10_000


def _typed_table(conn: Any) -> None:
    """bench_ingest's ``bench`` table and publication, with numeric(12,2) and a boolean column."""
    _fresh_table(conn)
    _sql(conn, "ALTER TABLE bench ALTER COLUMN c TYPE numeric(12,2), ADD COLUMN e boolean DEFAULT (random() < 0.5)")


def _update(conn: Any, rows: int) -> None:
    """UPDATE ids 0 .. rows-1 (text, numeric, timestamptz and boolean columns) in 10,000-row transactions."""
    for lo in range(0, rows, PER_TXN):
        hi = min(lo + PER_TXN, rows) - 1
        _sql(conn, "UPDATE bench SET b = b || '-u', c = c + 1, d = now(), e = NOT e WHERE id BETWEEN %s AND %s", (lo, hi))


class SparkJobs:
    """Spark jobs run during a block of driver code, by call site, from the Spark UI's REST API."""

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        self.url = self.sc.uiWebUrl

    def _jobs(self) -> list[dict[str, Any]]:
        if not self.url:
            return []
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/applications/{self.sc.applicationId}/jobs", timeout=10) as r:
                return json.load(r)
        except OSError:
            return []

    def last_id(self) -> int:
        return max((j["jobId"] for j in self._jobs()), default=-1)

    def since(self, after: int) -> dict[str, tuple[int, float]]:
        """{call site: (jobs, seconds)} of the jobs after job id ``after`` (waits for the UI to list them all)."""
        for _ in range(20):
            jobs = [j for j in self._jobs() if j["jobId"] > after]
            if all(j.get("completionTime") for j in jobs):
                break
            time.sleep(0.25)
        out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for j in jobs:
            if not j.get("completionTime"):
                continue
            seconds = (_ui_time(j["completionTime"]) - _ui_time(j["submissionTime"])).total_seconds()
            site = _site(j["name"])
            out[site][0] += 1
            out[site][1] += seconds
        return {k: (int(v[0]), v[1]) for k, v in out.items()}


def _site(name: str) -> str:
    """A job's call site, shortened: PySpark names actions by their Python line, Spark's own jobs less helpfully."""
    if "withThreadLocalCaptured" in name:
        return "AQE query stages"  # shuffle stages adaptive execution submits on its own (the write's window/exchange)
    if name.startswith("parquet at ") and ".py:" not in name:
        return "parquet"  # DataFrameWriter/Reader.parquet: the write's final stage, schema merging, listing
    return name.replace(str(Path(__file__).resolve().parents[1]) + "/", "")


def _ui_time(text: str) -> datetime:
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    result = fn()
    return time.monotonic() - started, result


def _ingest(spark: Any, dsn: str, slot: str, output: str, plugin: str, typed: bool,
            max_changes: int | None = None) -> tuple[float, RunSummary]:
    opts = IngestOptions(slot=slot, output=output, plugin=plugin, typed_tables=typed, dsn=dsn, max_changes=max_changes,
                         publications=("bench_pub",) if plugin == "pgoutput" else ())
    return _timed(lambda: run_ingest(opts, spark=spark))


def _materialize(spark: Any, jobs: SparkJobs, output: str, full: bool) -> tuple[float, TableState, dict[str, tuple[int, float]]]:
    before = jobs.last_id()
    seconds, states = _timed(lambda: run_materialize(MaterializeOptions(output=output, full=full), spark=spark))
    (state,) = states
    return seconds, state, jobs.since(before)


def measure(cluster: ThrowawayCluster, spark: Any, changes: int, plugin: str, work: Path) -> dict[str, Any]:
    """Both measurements for one plugin (fresh table, slots and outputs)."""
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    jobs = SparkJobs(spark)
    _typed_table(conn)
    tag = f"{plugin[:2]}{changes}"
    warm, plain, typed = f"warm_{tag}", f"plain_{tag}", f"typed_{tag}"
    _slot(conn, warm, plugin)
    _sql(conn, "INSERT INTO bench SELECT -g, g, 'warm-' || g, g * 1.5, now() FROM generate_series(1, 1000) g")
    _slot(conn, plain, plugin)
    _slot(conn, typed, plugin)
    _fill(conn, changes, PER_TXN)
    # warm-up: the first Spark jobs of a session start Python workers and JIT the readers and writers
    _ingest(spark, dsn, warm, str(work / warm), plugin, True, max_changes=1000)
    run_materialize(MaterializeOptions(output=str(work / warm)), spark=spark)
    _sql(conn, "SELECT pg_drop_replication_slot(%s)", (warm,))

    plain_s, plain_sum = _ingest(spark, dsn, plain, str(work / plain), plugin, False)
    _sql(conn, "SELECT pg_drop_replication_slot(%s)", (plain,))
    typed_s, typed_sum = _ingest(spark, dsn, typed, str(work / typed), plugin, True)
    out = str(work / typed)
    first_s, first, first_jobs = _materialize(spark, jobs, out, full=False)

    updates = changes // 10
    _update(conn, updates)
    second_s, second_sum = _ingest(spark, dsn, typed, out, plugin, True)
    incr_s, incr, incr_jobs = _materialize(spark, jobs, out, full=False)
    full_s, full, full_jobs = _materialize(spark, jobs, out, full=True)
    _sql(conn, "SELECT pg_drop_replication_slot(%s)", (typed,))
    conn.close()
    return {
        "plugin": plugin, "changes": changes, "updates": updates,
        "plain_s": plain_s, "plain_batch_s": plain_sum.batch_seconds, "plain_changes": plain_sum.changes,
        "plain_batches": plain_sum.batches,
        "typed_s": typed_s, "typed_batch_s": typed_sum.batch_seconds, "typed_changes": typed_sum.changes,
        "typed_batches": typed_sum.batches,
        "second_s": second_s, "second_changes": second_sum.changes,
        "first_s": first_s, "first": first, "first_jobs": first_jobs,
        "incr_s": incr_s, "incr": incr, "incr_jobs": incr_jobs,
        "full_s": full_s, "full": full, "full_jobs": full_jobs,
    }


def _jobs_line(label: str, seconds: float, jobs: dict[str, tuple[int, float]]) -> str:
    if not jobs:
        return f"  {label}: {seconds:.2f} s (Spark UI not reachable: no job breakdown)"
    in_jobs = sum(s for _n, s in jobs.values())
    parts = ", ".join(f"{site} {s:.2f} s" + (f" ({n} jobs)" if n > 1 else "")
                      for site, (n, s) in sorted(jobs.items(), key=lambda kv: -kv[1][1]))
    return f"  {label}: {seconds:.2f} s = Spark jobs {in_jobs:.2f} s [{parts}] + driver {seconds - in_jobs:.2f} s"


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--plugin", choices=["pgoutput", "test_decoding"], help="one plugin (default: both)")
    args = parser.parse_args()
    plugins = [args.plugin] if args.plugin else ["pgoutput", "test_decoding"]
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={"max_wal_size": "4GB", "work_mem": "64MB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-typed-"))
    spark = None
    load_before = os.getloadavg()[0]
    try:
        spark_s, spark = _timed(lambda: spark_session("pgpoll-bench"))
        results = []
        for plugin in plugins:
            r = measure(cluster, spark, args.changes, plugin, work)
            results.append(r)
            print(f"  {plugin}: plain {r['plain_s']:.2f} s, typed {r['typed_s']:.2f} s, materialize full "
                  f"{r['first_s']:.2f} s, incremental {r['incr_s']:.2f} s, --full {r['full_s']:.2f} s",
                  file=sys.stderr, flush=True)
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    import pyspark

    load_after = os.getloadavg()[0]

    print(f"PostgreSQL {inst.version}, Spark {pyspark.__version__} (local[*], one session, started in {spark_s:.2f} s, "
          f"not counted); backlog of {args.changes:,} inserts in {PER_TXN:,}-row transactions, then "
          f"{args.changes // 10:,} updates; table bench (bigint key, bigint, text, numeric(12,2), timestamptz, boolean); "
          f"{os.cpu_count()} cores, load average {load_before:.1f} before and {load_after:.1f} after")
    print()
    print("| plugin | ingest plain | ingest --typed-tables | typed / plain | materialize (first, full) "
          "| ingest of the updates (typed) | materialize incremental | materialize --full | incremental / full |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['plugin']} | {r['plain_s']:.2f} s | {r['typed_s']:.2f} s | {r['typed_s'] / r['plain_s']:.2f}x "
              f"| {r['first_s']:.2f} s | {r['second_s']:.2f} s | {r['incr_s']:.2f} s | {r['full_s']:.2f} s "
              f"| {r['incr_s'] / r['full_s']:.2f}x |")
    print()
    for r in results:
        print(f"{r['plugin']}: changes written plain {r['plain_changes']:,} in {r['plain_batches']} batch(es) "
              f"(batches {r['plain_batch_s']:.2f} s), typed {r['typed_changes']:,} in {r['typed_batches']} batch(es) "
              f"(batches {r['typed_batch_s']:.2f} s), updates {r['second_changes']:,}; state rows "
              f"{r['first'].rows:,} ({r['first'].mode}), {r['incr'].rows:,} ({r['incr'].mode}, {r['incr'].batches} batch), "
              f"{r['full'].rows:,} ({r['full'].mode}, {r['full'].batches} batches)")
        print(_jobs_line("materialize (first, full)", r["first_s"], r["first_jobs"]))
        print(_jobs_line("materialize incremental", r["incr_s"], r["incr_jobs"]))
        print(_jobs_line("materialize --full", r["full_s"], r["full_jobs"]))


if __name__ == "__main__":
    main()
