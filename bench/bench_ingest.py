"""Benchmark: drain a backlog end to end and compare with the server's own decode time.

Prints, from runs on one throwaway server, side by side: the server's decode
time (``count(*)`` over the same peek, the fastest of three), ``pg_recvlogical`` writing the same
backlog to a file, pgpoll end to end (a real ``jobs/ingest.py`` process, as
users run it: on a local Spark and a local output its batches run in the
driver and no Spark starts), plain and with ``--typed-tables``, pgpoll's time
for an empty run, and the two gate metrics of the throughput issue:

* **gate** = (drain time - empty run) / server decode (goal <= 3x);
* **typed / plain** = (typed drain - empty run) / (plain drain - empty run) (goal <= 1.25x).

Also the same drain with every batch a Spark job (``PGPOLL_DRIVER_BATCH_WAL=0``,
what ``spark-submit`` to a cluster does with a large batch) against an empty
run of that kind (Spark's start-up and a first job).

Where the time goes, in this process without Spark on the same peek: the
batch task's fetch + decode + Arrow columns alone, and the same plus pyarrow's
Parquet writer (the task's own writer, ``pgpoll.ingest.batch_writes.write_batch``).
Also the batch task's peak memory for one 200k-row and one 2M-row transaction
(goal: the 2M one at most 1.25x the 200k one). ``--writer spark`` runs pgpoll
with ``PGPOLL_WRITER=spark`` (Spark's Parquet writer behind ``mapInArrow``,
the fallback path) to compare the two writers; ``--repeat N`` takes medians.

    python bench/bench_ingest.py [--changes 1000000] [--plugin pgoutput] [--repeat 1] [--writer auto|spark]
                                 [--skip-memory] [--skip-typed] [--skip-task] [--txn-rows 10000]
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
from pathlib import Path
from typing import Any

import psycopg2

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

REPO = Path(__file__).resolve().parents[1]


def _sql(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def _ingest(dsn: str, slot: str, output: str, plugin: str, batch: int, *extra: str,
            writer: str = "auto", env_extra: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    args = [sys.executable, str(REPO / "jobs" / "ingest.py"), "--slot", slot, "--output", output, "--batch-changes", str(batch)]
    if plugin == "pgoutput":
        args += ["--publication", "bench_pub"]
    args += list(extra)
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable, PGPOLL_WRITER=writer, **(env_extra or {}))
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
    _sql(conn, "DROP TABLE IF EXISTS bench; "
               "CREATE TABLE bench (id bigint PRIMARY KEY, a bigint, b text, c numeric, d timestamptz)")
    _sql(conn, "DROP PUBLICATION IF EXISTS bench_pub; CREATE PUBLICATION bench_pub FOR TABLE bench")


def _fill(conn: Any, rows: int, per_txn: int, start: int = 0) -> None:
    for lo in range(start, start + rows, per_txn):
        hi = min(lo + per_txn, start + rows) - 1
        _sql(conn, "INSERT INTO bench SELECT g, g * 2, 'name-' || g, g * 1.5, now() FROM generate_series(%s, %s) g", (lo, hi))


def measure_task(dsn: str, slot: str, plugin: str, work: Path) -> dict[str, float]:
    """The batch task without Spark on ``slot`` (peeked, never advanced): decode alone, then decode + pyarrow write."""
    from pgpoll.ingest.batch_writes import write_batch
    from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
    from pgpoll.sink.parquet_writer import StagingTarget
    from pgpoll.source.slots import peek_options

    options = tuple(peek_options(plugin, publications=["bench_pub"] if plugin == "pgoutput" else None))
    spec = BatchSpec(dsn=dsn, slot=slot, plugin=plugin, options=options, upto_nchanges=None, high_water_mark=None)
    started = time.perf_counter()
    rows = sum(batch.num_rows for batch in iter_batch(spec, BatchOutcome()))
    decode_s = time.perf_counter() - started
    target = work / f"task_{slot}"
    spec = BatchSpec(dsn=dsn, slot=slot, plugin=plugin, options=options, upto_nchanges=None, high_water_mark=None,
                     target=StagingTarget(str(target / "envelope")))
    started = time.perf_counter()
    outcome = BatchOutcome()
    write_batch(spec, outcome)
    write_s = time.perf_counter() - started
    if outcome.error is not None:
        raise SystemExit(f"task failed: {outcome.error}")
    shutil.rmtree(target, ignore_errors=True)
    return {"task_rows": rows, "task_decode_s": decode_s, "task_write_s": write_s}


def measure_backlog(
    cluster: ThrowawayCluster, changes: int, plugin: str, work: Path, run: int = 0, *, typed: bool = True,
    task: bool = True, writer: str = "auto", txn_rows: int = 10_000,
) -> dict[str, Any]:
    """Server decode, pg_recvlogical and pgpoll end to end on one backlog (``run`` keeps slot names apart).

    ``typed`` adds a ``--typed-tables`` drain of the same backlog; ``task``
    the batch task's own times without Spark (:func:`measure_task`).
    """
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    tag = f"{plugin[:2]}{changes}r{run}"
    for name in (f"srv_{tag}", f"rcv_{tag}", f"pgp_{tag}", f"drv_{tag}", *([f"typ_{tag}"] if typed else [])):
        _slot(conn, name, plugin)
    _fill(conn, changes, txn_rows)
    _slot(conn, f"nil_{tag}", plugin)  # empty slots: measure runs with nothing to do
    _slot(conn, f"njb_{tag}", plugin)
    end_lsn = _sql(conn, "SELECT pg_current_wal_lsn()::text")[0][0]

    if plugin == "pgoutput":
        peek = (
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true')"
        )
    else:
        peek = "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, 'include-xids', '1', 'include-timestamp', '1')"
    times = []
    for _ in range(3):  # the first read of the WAL may come from disk: the fastest of three, the strict denominator
        started = time.perf_counter()
        rows = _sql(conn, peek, (f"srv_{tag}",))[0][0]
        times.append(time.perf_counter() - started)
    server_s = min(times)

    recv = shutil.which("pg_recvlogical", path=str(cluster.installation.bindir)) or shutil.which("pg_recvlogical")
    recv_s = None
    if recv:
        cmd = [
            recv, "-d", dsn, "--slot", f"rcv_{tag}", "--start", "--endpos", end_lsn, "--no-loop",
            "-f", str(work / f"{tag}.out"),
        ]
        if plugin == "pgoutput":
            cmd += ["-o", "proto_version=1", "-o", "publication_names=bench_pub"]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        recv_s = time.perf_counter() - started

    empty_s, _ = _ingest(dsn, f"nil_{tag}", str(work / f"nil_{tag}"), plugin, changes * 3, writer=writer)
    # the fixed cost of a run that starts Spark: its batches as Spark jobs even when small
    empty_job_s, _ = _ingest(dsn, f"njb_{tag}", str(work / f"njb_{tag}"), plugin, changes * 3, writer=writer,
                             env_extra={"PGPOLL_DRIVER_BATCH_WAL": "0"})
    full_s, summary = _ingest(dsn, f"pgp_{tag}", str(work / f"pgp_{tag}"), plugin, changes * 3, writer=writer)
    shutil.rmtree(work / f"pgp_{tag}", ignore_errors=True)
    # the same drain with every batch a Spark job (spark-submit on a cluster, or PGPOLL_DRIVER_BATCH_WAL=0)
    spark_s, _ = _ingest(dsn, f"drv_{tag}", str(work / f"drv_{tag}"), plugin, changes * 3, writer=writer,
                         env_extra={"PGPOLL_DRIVER_BATCH_WAL": "0"})
    shutil.rmtree(work / f"drv_{tag}", ignore_errors=True)
    result: dict[str, Any] = {}
    if typed:
        typed_s, typed_summary = _ingest(dsn, f"typ_{tag}", str(work / f"typ_{tag}"), plugin, changes * 3,
                                         "--typed-tables", writer=writer)
        shutil.rmtree(work / f"typ_{tag}", ignore_errors=True)
        result.update(typed_s=typed_s, typed_net_s=typed_s - empty_s, typed_batch_s=typed_summary["batch_seconds"],
                      typed_ratio=(typed_s - empty_s) / max(full_s - empty_s, 1e-9))
    if task:
        result.update(measure_task(dsn, f"srv_{tag}", plugin, work))
    for name in (f"srv_{tag}", f"rcv_{tag}", f"nil_{tag}", f"njb_{tag}", f"pgp_{tag}", f"drv_{tag}",
                 *([f"typ_{tag}"] if typed else [])):
        _sql(conn, "SELECT pg_drop_replication_slot(%s)", (name,))  # leave no slot pinning WAL for the next run
    conn.close()
    net = full_s - empty_s
    result.update({
        "plugin": plugin, "changes": changes, "peek_rows": rows, "server_s": server_s, "recvlogical_s": recv_s,
        "pgpoll_s": full_s, "pgpoll_empty_s": empty_s, "pgpoll_empty_job_s": empty_job_s, "pgpoll_net_s": net,
        "ratio": net / server_s, "spark_s": spark_s, "spark_ratio": (spark_s - empty_job_s) / server_s,
        "written": summary["changes"], "batch_s": summary["batch_seconds"], "writer": summary.get("writer"),
        "fetch": summary.get("fetch"),
    })
    return result


def measure_memory(cluster: ThrowawayCluster, rows: int, plugin: str, work: Path, writer: str = "auto") -> int:
    """Peak RSS (kB) of the batch task for one transaction of ``rows`` rows."""
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    slot = f"mem_{plugin[:2]}_{rows}"
    _slot(conn, slot, plugin)
    _fill(conn, rows, rows)
    conn.close()
    _s, summary = _ingest(dsn, slot, str(work / slot), plugin, rows * 3, writer=writer)
    return int(summary["task_peak_rss_kb"])


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--plugin", choices=["pgoutput", "test_decoding"], default="pgoutput")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--writer", choices=["auto", "pyarrow", "spark"], default="auto")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-typed", action="store_true")
    parser.add_argument("--skip-task", action="store_true")
    parser.add_argument("--txn-rows", type=int, default=10_000, help="rows per transaction of the backlog")
    args = parser.parse_args()
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={"max_wal_size": "4GB", "work_mem": "64MB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-"))
    load_before = os.getloadavg()[0]
    try:
        runs = [
            measure_backlog(cluster, args.changes, args.plugin, work, run, typed=not args.skip_typed,
                            task=not args.skip_task, writer=args.writer, txn_rows=args.txn_rows)
            for run in range(args.repeat)
        ]
        r = runs[0]

        def m(key: str) -> float:
            value = median(runs, key)
            return float("nan") if value is None else value

        print(f"PostgreSQL {inst.version}, plugin {r['plugin']}, backlog {r['changes']:,} changes in "
              f"{args.txn_rows:,}-row transactions ({r['peek_rows']:,} peek rows), writer {r['writer']}, fetch "
              f"{r['fetch']}; medians of {args.repeat} run(s); {os.cpu_count()} cores, load average "
              f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(f"  server decode (count(*) over the peek): {m('server_s'):.2f} s")
        if median(runs, "recvlogical_s") is not None:
            print(f"  pg_recvlogical to a file:               {m('recvlogical_s'):.2f} s")
        print(f"  pgpoll empty run:                       {m('pgpoll_empty_s'):.2f} s (as users run it: no Spark "
              f"on a local output)")
        print(f"  pgpoll drain, plain:                    {m('pgpoll_s'):.2f} s (batches {m('batch_s'):.2f} s)")
        if not args.skip_typed:
            print(f"  pgpoll drain, --typed-tables:           {m('typed_s'):.2f} s (batches {m('typed_batch_s'):.2f} s)")
        gate = f"  GATE (drain - empty run) / server:      {m('ratio'):.2f}x (goal <= 3x)"
        if not args.skip_typed:
            gate += f"   |   typed / plain (net of the empty run): {m('typed_ratio'):.2f}x (goal <= 1.25x)"
        print(gate)
        print(f"  every batch a Spark job (PGPOLL_DRIVER_BATCH_WAL=0, as under spark-submit on a cluster): empty run "
              f"{m('pgpoll_empty_job_s'):.2f} s, drain {m('spark_s'):.2f} s, (drain - empty) / server "
              f"{m('spark_ratio'):.2f}x")
        if not args.skip_task:
            print(f"  where the time goes (no Spark, same peek, {r['task_rows']:,} rows): task fetch+decode+Arrow "
                  f"{m('task_decode_s'):.2f} s; the same with pyarrow's Parquet write (on its thread) {m('task_write_s'):.2f} s; "
                  f"the rest of the "
                  f"plain drain's batch time (publish, advance, end-of-run heartbeat) {m('batch_s') - m('task_write_s'):.2f} s")
        print(f"  changes written: {r['written']:,}")
        if not args.skip_memory:
            small = measure_memory(cluster, 200_000, args.plugin, work, args.writer)
            large = measure_memory(cluster, 2_000_000, args.plugin, work, args.writer)
            print(f"  task peak RSS, one 200k-row transaction: {small / 1024:.0f} MiB; one 2M-row transaction: "
                  f"{large / 1024:.0f} MiB = {large / small:.2f}x (goal <= 1.25x)")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
