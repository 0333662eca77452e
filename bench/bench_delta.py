"""Benchmark: an incremental ``materialize --format delta`` against a ``--full`` rebuild of the same table.

On one throwaway server: a 6-column table of ``--rows`` rows (bigint key,
int, text, timestamptz, numeric, text) is ingested with ``--typed-tables`` and
materialized as a Delta table; then, per case,

* **recent**: ``--updates`` UPDATEs of keys among the most recent 1%
  (appends and updates of recent rows, the workload the layout is made for);
* **random**: ``--updates`` UPDATEs of keys drawn over the whole table;

are ingested and the table is materialized incrementally, then rebuilt with
``--full`` from the same change log, and both are printed side by side with
the files the incremental commit rewrote and kept. Both run in this process
on one warm SparkSession (``run_materialize``, what ``pgpoll materialize``
calls), so Spark's start-up (about 10 s here, printed) is in neither: a
separate process adds it to both. Gate: incremental / full <= 25% for
the recent case (random updates may rewrite every file, never more than a
rebuild). ``--small`` also times a first materialize of five 1,000-row tables
against a Python process that starts and stops a SparkSession (goal: <= 5 s
more).

    python bench/bench_delta.py [--rows 2000000] [--updates 10000] [--small]
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
EMPTY_SPARK = "from pgpoll.spark.session import spark_session; spark_session('pgpoll-empty').stop()"


def _sql(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def _job(name: str, dsn: str, *args: str) -> tuple[float, list[dict[str, Any]]]:
    """``jobs/<name>.py ARGS`` in its own process: seconds and its JSON lines."""
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "jobs" / f"{name}.py"), *args], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return seconds, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _ingest(dsn: str, out: str) -> float:
    seconds, _ = _job("ingest", dsn, "--slot", "bench_delta_slot", "--publication", "bench_pub", "--output", out,
                      "--typed-tables", "--batch-changes", "5000000")
    return seconds


def _materialize(dsn: str, out: str, *extra: str) -> tuple[float, dict[str, Any]]:
    """``jobs/materialize.py --format delta`` in its own process (its own Spark)."""
    seconds, lines = _job("materialize", dsn, "--output", out, "--format", "delta", "--json", *extra)
    tables = [t for t in lines if "table" in t]
    return seconds, tables[0] if len(tables) == 1 else {"tables": tables}


def _in_process(spark: Any, out: str, full: bool = False) -> tuple[float, dict[str, Any]]:
    """One Delta materialize of ``out`` on the warm ``spark``: seconds and the table's JSON line."""
    from pgpoll.materialize.delta.state import DeltaMaterializer
    from pgpoll.materialize.run import MaterializeOptions, run_materialize

    started = time.perf_counter()
    states = run_materialize(MaterializeOptions(output=out, full=full), spark, materializer=DeltaMaterializer)
    seconds = time.perf_counter() - started
    return seconds, json.loads(states[0].to_json())


def _case(conn: Any, spark: Any, dsn: str, out: str, name: str, update: str, params: Any) -> dict[str, Any]:
    _sql(conn, update, params)
    _ingest(dsn, out)
    inc_s, inc = _in_process(spark, out)
    full_s, full = _in_process(spark, out, full=True)
    files = inc.get("files") or {}
    print(f"  {name:<7} incremental {inc_s:7.2f} s ({inc['mode']}, files rewritten {files.get('rewritten')}, "
          f"added {files.get('added')}, kept {files.get('kept')})   --full {full_s:7.2f} s "
          f"({full['files']['added']} files)   incremental / full = {inc_s / full_s:.0%}", flush=True)
    return {"incremental_s": inc_s, "full_s": full_s, "ratio": inc_s / full_s, "files": files}


def _small(conn: Any, dsn: str, work: Path) -> None:
    """Five tables of 1,000 rows: a first materialize against an empty Spark process."""
    names = [f"small_{i}" for i in range(5)]
    for n in names:
        _sql(conn, f"CREATE TABLE {n} (id int PRIMARY KEY, a text, b numeric, c timestamptz)")
        _sql(conn, f"INSERT INTO {n} SELECT g, 'v' || g, g * 0.5, now() FROM generate_series(1, 1000) g")
    _sql(conn, f"CREATE PUBLICATION small_pub FOR TABLE {', '.join(names)}")
    out = str(work / "small")
    _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot('small_slot', 'pgoutput')")
    for n in names:  # the changes after the slot's creation
        _sql(conn, f"UPDATE {n} SET a = a || '!'")
    _job("ingest", dsn, "--slot", "small_slot", "--publication", "small_pub", "--output", out, "--typed-tables")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", EMPTY_SPARK], check=True, capture_output=True, cwd=REPO)
    empty_s = time.perf_counter() - started
    first_s, _ = _materialize(dsn, out)
    _sql(conn, "UPDATE small_0 SET a = 'x' WHERE id <= 15")
    _job("ingest", dsn, "--slot", "small_slot", "--publication", "small_pub", "--output", out, "--typed-tables")
    inc_s, _ = _materialize(dsn, out)
    print(f"  5 tables x 1,000 rows: empty Spark process {empty_s:.2f} s, first materialize {first_s:.2f} s "
          f"(+{first_s - empty_s:.2f} s, goal <= 5 s), incremental of 15 changes {inc_s:.2f} s "
          f"(+{inc_s - empty_s:.2f} s)", flush=True)


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--small", action="store_true", help="also time five 1,000-row tables")
    args = parser.parse_args()
    found = find_bindirs()
    if not found:
        raise SystemExit("no PostgreSQL installation found")
    cluster = ThrowawayCluster(found.get(15) or found[max(found)], settings={"max_wal_size": "4GB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-delta-"))
    os.chmod(work, 0o777)
    load_before = os.getloadavg()[0]
    try:
        dsn = cluster.dsn()
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        _sql(conn, "CREATE TABLE bench_delta (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric, e text)")
        _sql(conn, "CREATE PUBLICATION bench_pub FOR TABLE bench_delta")
        _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot('bench_delta_slot', 'pgoutput')")
        step = 250_000
        for lo in range(1, args.rows + 1, step):
            _sql(conn, "INSERT INTO bench_delta SELECT g, g %% 1000, 'name-' || g, now() - g * interval '1 second', "
                       "g * 1.25, md5(g::text) FROM generate_series(%s, %s) g", (lo, min(lo + step, args.rows + 1) - 1))
        out = str(work / "out")
        ingest_s = _ingest(dsn, out)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", EMPTY_SPARK], check=True, capture_output=True, cwd=REPO)
        empty_s = time.perf_counter() - started
        from pgpoll.spark.session import spark_session

        spark = spark_session("pgpoll-bench-delta")
        first_s, first = _in_process(spark, out)
        print(f"{args.rows:,} rows x 6 columns, {args.updates:,} updates per case; {os.cpu_count()} cores, "
              f"load average {load_before:.1f} before")
        print(f"  ingest {ingest_s:.2f} s; Spark start-up (an empty Spark process) {empty_s:.2f} s; first materialize "
              f"{first_s:.2f} s ({first['rows']:,} rows, {first['files']['added']} files); materialize times below are "
              "on one warm SparkSession", flush=True)
        recent = max(args.rows // 100, args.updates)
        pick = "UPDATE bench_delta SET a = a + 1, e = 'u' WHERE id IN (SELECT id FROM bench_delta WHERE id > %s " \
               "ORDER BY random() LIMIT %s)"
        gate = _case(conn, spark, dsn, out, "recent", pick, (args.rows - recent, args.updates))
        _case(conn, spark, dsn, out, "random", "UPDATE bench_delta SET a = a + 1, e = 'r' WHERE id IN "
              "(SELECT (random() * %s)::bigint + 1 FROM generate_series(1, %s))", (args.rows - 1, args.updates))
        print(f"  GATE recent incremental / full = {gate['ratio']:.0%} (goal <= 25%); load average "
              f"{os.getloadavg()[0]:.1f} after", flush=True)
        spark.stop()
        if args.small:
            _small(conn, dsn, work)
        conn.close()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
