"""Benchmark: drain a backlog end to end, as users run it, and compare with the server's own decode time.

Prints, from runs on one throwaway server, side by side on the same backlog
(each run on a slot of its own): the server's decode time (``count(*)`` over
the same peek, the fastest of three), ``pg_recvlogical`` writing the same
backlog to a file, and pgpoll end to end as a real ``jobs/ingest.py``
process (on a local Spark and a local output its batches run in the
driver and no Spark starts):

* **at the default options** (no batch option at all: what a user catching
  up after a weekend runs) — the gate: (drain - an empty run) / server decode
  (goal <= 2x), the number of batches, the process's peak RSS;
* **as one batch** (``--batch-changes`` three times the backlog, the figure
  earlier rounds published);
* at the defaults with ``--typed-tables``: typed / plain, both net of the
  empty run (goal <= 1.25x);
* at the defaults with every batch a Spark job (``PGPOLL_DRIVER_BATCH_WAL=0``,
  what ``spark-submit`` to a cluster does with a large batch), against an
  empty run of that kind;
* with ``--baseline DIR`` (a checkout of another pgpoll, e.g. ``git worktree
  add BASE main``), that tree's defaults and one batch on the same
  backlog, run by this interpreter with ``PYTHONPATH=DIR``: before and after
  in one run.

``--memory-rows N`` also drains one transaction of N rows at the default
options and reports the process's peak RSS (the bound a run's memory keeps
whatever the backlog). ``--skip-task`` leaves out where the time goes inside
the batch task (no Spark, same peek: decode alone, then with pyarrow's
writer); ``--repeat N`` takes medians.

    python bench/bench_ingest.py [--changes 1000000] [--plugin pgoutput] [--txn-rows 10000] [--repeat 3]
                                 [--writer auto|spark] [--baseline DIR] [--memory-rows 10000000]
                                 [--skip-typed] [--skip-spark] [--skip-task]
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
SETTINGS = {"max_wal_size": "4GB", "work_mem": "64MB"}


def _sql(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def ingest_run(dsn: str, slot: str, output: str, plugin: str, *extra: str, tree: Path = REPO, writer: str = "auto",
               env_extra: dict[str, str] | None = None, keep: bool = False) -> tuple[float, dict[str, Any], int]:
    """One ``jobs/ingest.py`` process of ``tree``: (seconds, its summary, its peak RSS in kB); the output is
    removed after it unless ``keep``."""
    args = [sys.executable, str(tree / "jobs" / "ingest.py"), "--slot", slot, "--output", output, *extra]
    if plugin == "pgoutput":
        args += ["--publication", "bench_pub"]
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable, PGPOLL_WRITER=writer, **(env_extra or {}))
    if tree != REPO:
        env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed ({proc.returncode}): {stderr[-2000:]}")
    return seconds, json.loads(stdout.strip().splitlines()[-1]), int(usage.ru_maxrss)


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


def _server_decode(conn: Any, slot: str, plugin: str) -> tuple[float, int]:
    """The fastest of three ``count(*)`` over the slot's whole peek (the first read may come from disk)."""
    if plugin == "pgoutput":
        peek = ("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                "'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true')")
    else:
        peek = ("SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, 'include-xids', '1', "
                "'include-timestamp', '1')")
    times = []
    for _ in range(3):
        started = time.perf_counter()
        rows = _sql(conn, peek, (slot,))[0][0]
        times.append(time.perf_counter() - started)
    return min(times), int(rows)


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
    spark: bool = True, task: bool = True, writer: str = "auto", txn_rows: int = 10_000, baseline: Path | None = None,
) -> dict[str, Any]:
    """Every measurement of the module docstring on one backlog (``run`` keeps slot names apart).

    Ratios are taken per run (each over this run's server decode and empty run) before any median.
    """
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    tag = f"{plugin[:2]}{changes}t{txn_rows}r{run}"
    drains = ["srv", "rcv", "def", "one", *(["typ"] if typed else []), *(["drv"] if spark else []),
              *(["bdef", "bone"] if baseline is not None else [])]
    empties = ["nil", *(["njb"] if spark else []), *(["bnil"] if baseline is not None else [])]
    for name in drains:
        _slot(conn, f"{name}_{tag}", plugin)
    _fill(conn, changes, txn_rows)
    for name in empties:  # empty slots: runs with nothing to do (their restart_lsn is past the backlog)
        _slot(conn, f"{name}_{tag}", plugin)
    end_lsn = _sql(conn, "SELECT pg_current_wal_lsn()::text")[0][0]
    wal_mib = _sql(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) / 1048576.0 "
                         "FROM pg_replication_slots WHERE slot_name = %s", (f"srv_{tag}",))[0][0]
    server_s, rows = _server_decode(conn, f"srv_{tag}", plugin)

    recv = shutil.which("pg_recvlogical", path=str(cluster.installation.bindir)) or shutil.which("pg_recvlogical")
    recv_s = None
    if recv:
        cmd = [recv, "-d", dsn, "--slot", f"rcv_{tag}", "--start", "--endpos", end_lsn, "--no-loop",
               "-f", str(work / f"{tag}.out")]
        if plugin == "pgoutput":
            cmd += ["-o", "proto_version=1", "-o", "publication_names=bench_pub"]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        recv_s = time.perf_counter() - started
        (work / f"{tag}.out").unlink(missing_ok=True)

    def run_on(name: str, *extra: str, **kw: Any) -> tuple[float, dict[str, Any], int]:
        return ingest_run(dsn, f"{name}_{tag}", str(work / f"{name}_{tag}"), plugin, *extra, writer=writer, **kw)

    one_batch = ("--batch-changes", str(changes * 3))
    no_jobs = {"PGPOLL_DRIVER_BATCH_WAL": "0"}
    empty_s, _, _ = run_on("nil")
    full_s, summary, rss_kb = run_on("def")
    one_s, one_summary, one_rss_kb = run_on("one", *one_batch)
    result: dict[str, Any] = {}
    if typed:
        typed_s, _, _ = run_on("typ", "--typed-tables")
        result.update(typed_s=typed_s, typed_ratio=(typed_s - empty_s) / max(full_s - empty_s, 1e-9))
    if spark:
        empty_job_s, _, _ = run_on("njb", env_extra=no_jobs)  # Spark's start-up and a first job
        spark_s, spark_summary, _ = run_on("drv", env_extra=no_jobs)
        result.update(pgpoll_empty_job_s=empty_job_s, spark_s=spark_s, spark_ratio=(spark_s - empty_job_s) / server_s,
                      spark_batches=spark_summary["batches"])
    if baseline is not None:
        base_empty_s, _, _ = run_on("bnil", tree=baseline)
        base_s, base_summary, base_rss_kb = run_on("bdef", tree=baseline)
        base_one_s, _, _ = run_on("bone", *one_batch, tree=baseline)
        result.update(base_empty_s=base_empty_s, base_s=base_s, base_ratio=(base_s - base_empty_s) / server_s,
                      base_batches=base_summary["batches"], base_rss_mib=base_rss_kb / 1024, base_one_s=base_one_s,
                      base_one_ratio=(base_one_s - base_empty_s) / server_s)
    if task:
        result.update(measure_task(dsn, f"srv_{tag}", plugin, work))
    for name in drains + empties:
        _sql(conn, "SELECT pg_drop_replication_slot(%s)", (f"{name}_{tag}",))  # no slot pins WAL for the next run
    conn.close()
    result.update({
        "plugin": plugin, "changes": changes, "txn_rows": txn_rows, "peek_rows": rows, "wal_mib": float(wal_mib),
        "server_s": server_s, "recvlogical_s": recv_s, "pgpoll_s": full_s, "pgpoll_empty_s": empty_s,
        "ratio": (full_s - empty_s) / server_s, "batches": summary["batches"], "batch_s": summary["batch_seconds"],
        "rss_mib": rss_kb / 1024, "one_s": one_s, "one_ratio": (one_s - empty_s) / server_s,
        "one_batches": one_summary["batches"], "one_rss_mib": one_rss_kb / 1024, "written": summary["changes"],
        "writer": summary.get("writer"), "fetch": summary.get("fetch"),
    })
    return result


def measure_memory(cluster: ThrowawayCluster, rows: int, plugin: str, work: Path, writer: str = "auto",
                   baseline: Path | None = None) -> dict[str, float]:
    """Peak RSS (MiB) of a run at the default options draining one transaction of ``rows`` rows (and the baseline's)."""
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    slots = {"mem": REPO, **({"bmem": baseline} if baseline is not None else {})}
    for name in slots:
        _slot(conn, f"{name}_{plugin[:2]}_{rows}", plugin)
    _fill(conn, rows, rows)
    found: dict[str, float] = {}
    for name, tree in slots.items():
        slot = f"{name}_{plugin[:2]}_{rows}"
        seconds, summary, rss_kb = ingest_run(dsn, slot, str(work / slot), plugin, tree=tree, writer=writer)
        found[f"{name}_rss_mib"] = rss_kb / 1024
        found[f"{name}_s"] = seconds
        if summary["changes"] != rows:
            raise SystemExit(f"{slot}: {summary['changes']} changes written, {rows} expected")
        _sql(conn, "SELECT pg_drop_replication_slot(%s)", (slot,))
    _fresh_table(conn)  # the rows go; their WAL is recycled at the next checkpoints
    conn.close()
    return found


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def start_cluster() -> tuple[ThrowawayCluster, Any]:
    """A throwaway PostgreSQL 15 (else the newest found) with room for the backlogs' WAL."""
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    return ThrowawayCluster(inst, settings=SETTINGS).start(), inst


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--plugin", choices=["pgoutput", "test_decoding"], default="pgoutput")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--writer", choices=["auto", "pyarrow", "spark"], default="auto")
    parser.add_argument("--baseline", type=Path, default=None, help="another pgpoll checkout, run side by side")
    parser.add_argument("--memory-rows", type=int, default=0, help="also drain one transaction of N rows (peak RSS)")
    parser.add_argument("--skip-typed", action="store_true")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-task", action="store_true")
    parser.add_argument("--txn-rows", type=int, default=10_000, help="rows per transaction of the backlog")
    args = parser.parse_args()
    cluster, inst = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-"))
    load_before = os.getloadavg()[0]
    try:
        runs = []
        for run in range(args.repeat):
            r = measure_backlog(cluster, args.changes, args.plugin, work, run, typed=not args.skip_typed,
                                spark=not args.skip_spark, task=not args.skip_task, writer=args.writer,
                                txn_rows=args.txn_rows, baseline=args.baseline)
            runs.append(r)
            print(f"  run {run + 1}: server {r['server_s']:.2f} s, defaults {r['pgpoll_s']:.2f} s "
                  f"({r['ratio']:.2f}x), one batch {r['one_s']:.2f} s ({r['one_ratio']:.2f}x)"
                  + (f", baseline defaults {r['base_s']:.2f} s ({r['base_ratio']:.2f}x)" if args.baseline else "")
                  + f"; load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        r = runs[0]

        def m(key: str) -> float:
            value = median(runs, key)
            return float("nan") if value is None else value

        print(f"PostgreSQL {inst.version}, plugin {r['plugin']}, backlog {r['changes']:,} changes in "
              f"{args.txn_rows:,}-row transactions ({r['peek_rows']:,} peek rows, {r['wal_mib']:.0f} MiB of WAL), "
              f"writer {r['writer']}, fetch {r['fetch']}; medians of {args.repeat} run(s); {os.cpu_count()} cores, "
              f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(f"  server decode (count(*) over the peek): {m('server_s'):.2f} s")
        if median(runs, "recvlogical_s") is not None:
            print(f"  pg_recvlogical to a file:               {m('recvlogical_s'):.2f} s")
        print(f"  pgpoll empty run:                       {m('pgpoll_empty_s'):.2f} s")
        print(f"  GATE, default options: drain {m('pgpoll_s'):.2f} s in {m('batches'):.0f} batch(es), "
              f"(drain - empty run) / server {m('ratio'):.2f}x (goal <= 2x), peak RSS {m('rss_mib'):.0f} MiB")
        print(f"  one batch (--batch-changes {3 * r['changes']}): drain {m('one_s'):.2f} s, {m('one_ratio'):.2f}x")
        if not args.skip_typed:
            print(f"  --typed-tables at the defaults: drain {m('typed_s'):.2f} s, typed / plain (net of the empty run) "
                  f"{m('typed_ratio'):.2f}x (goal <= 1.25x)")
        if not args.skip_spark:
            print(f"  every batch a Spark job (PGPOLL_DRIVER_BATCH_WAL=0), defaults: empty run "
                  f"{m('pgpoll_empty_job_s'):.2f} s, drain {m('spark_s'):.2f} s, (drain - empty) / server "
                  f"{m('spark_ratio'):.2f}x")
        if args.baseline is not None:
            print(f"  baseline {args.baseline}: empty run {m('base_empty_s'):.2f} s; defaults: drain {m('base_s'):.2f} s in "
                  f"{m('base_batches'):.0f} batch(es), {m('base_ratio'):.2f}x, peak RSS {m('base_rss_mib'):.0f} MiB; "
                  f"one batch {m('base_one_s'):.2f} s, {m('base_one_ratio'):.2f}x")
        if not args.skip_task:
            print(f"  where the time goes (no Spark, same peek, {r['task_rows']:,} rows): task fetch+decode+Arrow "
                  f"{m('task_decode_s'):.2f} s; the same with pyarrow's Parquet write {m('task_write_s'):.2f} s")
        print(f"  changes written: {r['written']:,}")
        if args.memory_rows:
            mem = measure_memory(cluster, args.memory_rows, args.plugin, work, args.writer, args.baseline)
            line = (f"  one {args.memory_rows:,}-row transaction at the defaults: peak RSS {mem['mem_rss_mib']:.0f} MiB "
                    f"({mem['mem_s']:.1f} s)")
            if args.baseline is not None:
                line += f"; baseline {mem['bmem_rss_mib']:.0f} MiB ({mem['bmem_s']:.1f} s)"
            print(line)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
