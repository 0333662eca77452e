"""Benchmark: snapshot a 5-column table and compare with ``psql \\copy`` of the same rows.

Prints, from runs on one throwaway server, side by side in each round:
``psql -c "\\copy (select * from t) to /dev/null"`` (the server producing and
shipping every row, nothing else), ``pgpoll snapshot`` of an empty table (the
fixed work of a run), and ``pgpoll snapshot`` of the full table three ways: the
default (chunks read in binary through ADBC, one short snapshot each),
``PGPOLL_FETCH=psycopg2`` (the same chunks read as CSV text), and ``--mode
shared`` (one exported snapshot for the whole read). Every snapshot runs in
this process through one local SparkSession (``run_snapshot``, what ``pgpoll
snapshot`` calls), started once before the first round: Spark's own start-up
(20-50 s here, varying by more than the whole read on a shared 2-core machine),
and a first full read that starts its Python workers, are left out of every
figure. For each way, the issue's gate

* **snapshot / copy** = (full snapshot - empty snapshot) / copy (goal <= 1.0x),

rows/s, MB/s (Parquet bytes written), the longest any backend of the run
held one snapshot (``longest_snapshot_s`` of the summary: one chunk's read,
or the whole table's under ``--mode shared``), and in how many rounds the
chunked runs read a recheck (when a transaction id was handed out while
they read, autovacuum's included; pgpoll.snapshot.recheck). Also the peak memory of one
chunk read in a separate process at two chunk sizes (goal: a 1M-row chunk at
most 1.25x a 100k-row chunk). ``--repeat N`` takes medians of N rounds.

Beside wall times, CPU seconds (Linux ``/proc``: user and system time of a
process and its descendants, the exited ones its parent waited for
included): the server's (the postmaster's tree: every backend of the run)
and the client's (psql, or this process's tree: the Spark JVM and its Python
workers), less the empty snapshot's for the snapshots. Wall times on a shared
machine vary by more than the gate; CPU seconds much less, and their sum over
the cores is a floor for the wall time. ``cpu ratio`` = (server + client) /
cores / the copy's server CPU: the ratio a run would reach on idle cores kept
busy, against a copy as fast as its one backend (psql's wall time is about
its backend's CPU; both sides' CPU seconds grow alike on a loaded machine,
unlike wall times).

    python bench/bench_snapshot.py [--rows 2000000] [--repeat 3] [--parallelism 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _snapshot(spark: Any, dsn: str, slot: str, output: str, table: str, parallelism: int, *, mode: str = "auto",
              fetch: str = "auto") -> tuple[float, dict[str, Any]]:
    """One ``pgpoll snapshot`` run in this process's SparkSession: seconds and its summary."""
    from pgpoll.snapshot.run import SnapshotOptions, run_snapshot

    os.environ["PGPOLL_FETCH"] = fetch  # read by the driver, handed to the tasks
    opts = SnapshotOptions(slot=slot, output=output, publications=("bench_pub",), tables=(f"public.{table}",),
                           parallelism=parallelism, mode=mode, dsn=dsn)
    started = time.perf_counter()
    summary = run_snapshot(opts, spark=spark)
    seconds = time.perf_counter() - started
    if summary.status != "ok":
        raise SystemExit(f"snapshot failed: {summary.to_json()}")
    return seconds, json.loads(summary.to_json())


def _copy(cluster: ThrowawayCluster, dsn: str) -> tuple[float, float]:
    """psql's ``\\copy`` to /dev/null: seconds, and psql's own CPU seconds."""
    psql = shutil.which("psql", path=str(cluster.installation.bindir)) or shutil.which("psql")
    if psql is None:
        raise SystemExit("psql not found")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([psql, dsn, "-X", "-q", "-c", "\\copy (select * from bench_snap) to /dev/null"], check=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, each with the exited children it waited for (``/proc``:
    utime, stime, cutime, cstime); 0 where there is no ``/proc``."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (it exited meanwhile)
        parents[int(entry)] = int(fields[1])
        spent[int(entry)] = sum(int(f) for f in fields[11:15]) / _TICK
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += spent.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def _postmaster(conn: Any) -> int:
    """The server's postmaster: the parent of this connection's backend."""
    pid = _sql(conn, "SELECT pg_backend_pid()")[0][0]
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _chunk_peak_kb(dsn: str, rows: int) -> int:
    """Peak RSS (kB) of a process that reads one chunk of ``rows`` rows into typed Parquet, without Spark."""
    code = (
        "import dataclasses, resource, tempfile\n"
        "from pgpoll.snapshot.chunk_task import ChunkWork, write_chunk\n"
        "from pgpoll.source.connection import connect, resolve_dsn\n"
        "from pgpoll.source.snapshot.catalog import describe_table\n"
        "from pgpoll.source.snapshot.reads import ChunkSpec\n"
        f"conn = connect(resolve_dsn({dsn!r}))\n"
        "t = describe_table(conn, 'public', 'bench_snap', plugin='pgoutput')\n"
        "conn.close()\n"
        "t = dataclasses.replace(t, mode='chunked')  # a key range of exactly the rows wanted\n"
        f"work = ChunkWork(dsn={dsn!r}, output='', snapshot_id='', table=t, chunk=ChunkSpec(0, None, ({rows},)),\n"
        "                 lock_timeout_ms=5000)\n"
        "_stream, n, _held = write_chunk(work, tempfile.mkdtemp() + '/chunk.parquet')\n"
        f"assert n == {rows}, n\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"chunk read failed: {proc.stderr[-2000:]}")
    return int(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    found = find_bindirs()
    if not found:
        raise SystemExit("no PostgreSQL installation found")
    cluster = ThrowawayCluster(found[15] if 15 in found else found[max(found)]).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-snapshot-"))
    os.chmod(work, 0o777)
    try:
        dsn = cluster.dsn()
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        for t in ("bench_snap", "bench_empty"):
            _sql(conn, f"CREATE TABLE {t} (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric)")
        _sql(conn, "INSERT INTO bench_snap SELECT g, g %% 1000, 'name-' || g, now() - g * interval '1 second', "
                   "g * 1.25 FROM generate_series(1, %s) g", (args.rows,))
        _sql(conn, "VACUUM ANALYZE bench_snap")
        _sql(conn, "CREATE PUBLICATION bench_pub FOR TABLE bench_snap, bench_empty")
        _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot('bench_snap_slot', 'pgoutput')")
        from pgpoll.spark.session import spark_session

        spark = spark_session("pgpoll-bench-snapshot")
        # Warm-up, in no figure: one read of the full table starts a Python worker per task slot, each importing
        # pyarrow, ADBC and pgpoll once (an empty table's one task started one: the first round's full read paid
        # the second's start-up, 2-4 s of its wall time on this machine).
        _snapshot(spark, dsn, "bench_snap_slot", str(work / "warm"), "bench_snap", args.parallelism)
        shutil.rmtree(work / "warm", ignore_errors=True)
        kinds = {"binary": ("auto", "auto"), "csv": ("auto", "psycopg2"), "shared": ("shared", "auto")}
        server, me = _postmaster(conn), os.getpid()

        def cpu() -> tuple[float, float]:
            return _tree_cpu_s(server), _tree_cpu_s(me)

        runs: list[dict[str, Any]] = []
        for i in range(args.repeat):
            run: dict[str, Any] = {}
            before = cpu()
            run["copy_s"], run["copy_client_cpu"] = _copy(cluster, dsn)
            run["copy_server_cpu"] = cpu()[0] - before[0]
            before = cpu()
            run["empty_s"], _ = _snapshot(spark, dsn, "bench_snap_slot", str(work / f"empty{i}"), "bench_empty",
                                          args.parallelism)
            run["empty_cpu"] = tuple(b - a for a, b in zip(before, cpu(), strict=True))
            shutil.rmtree(work / f"empty{i}", ignore_errors=True)
            order = list(kinds)[i % len(kinds):] + list(kinds)[:i % len(kinds)]  # each way first in turn
            for kind in order:
                mode, fetch = kinds[kind]
                out = work / f"{kind}{i}"
                before = cpu()
                run[kind], run[f"{kind}_summary"] = _snapshot(spark, dsn, "bench_snap_slot", str(out), "bench_snap",
                                                              args.parallelism, mode=mode, fetch=fetch)
                run[f"{kind}_cpu"] = tuple(b - a for a, b in zip(before, cpu(), strict=True))
                shutil.rmtree(out, ignore_errors=True)
            runs.append(run)
            print(f"round {i + 1}: copy {run['copy_s']:.2f} s, empty snapshot {run['empty_s']:.2f} s, "
                  + ", ".join(f"{k} {run[k]:.2f} s" for k in kinds), flush=True)
        copy_s = statistics.median(r["copy_s"] for r in runs)
        empty_s = statistics.median(r["empty_s"] for r in runs)
        print(f"\nsnapshot of {args.rows:,} rows x 5 columns (bigint, int, text, timestamptz, numeric), "
              f"parallelism {args.parallelism}, medians of {args.repeat}:")
        print(f"  psql \\copy to /dev/null        {copy_s:8.2f} s")
        copy_cpu = [statistics.median(r[k] for r in runs) for k in ("copy_server_cpu", "copy_client_cpu")]
        empty_cpu = [statistics.median(r["empty_cpu"][j] for r in runs) for j in (0, 1)]
        print(f"    CPU: server {copy_cpu[0]:.2f} s, psql {copy_cpu[1]:.2f} s")
        print(f"  pgpoll snapshot, empty table    {empty_s:8.2f} s   (a run's fixed work; Spark already up)")
        print(f"    CPU: server {empty_cpu[0]:.2f} s, client {empty_cpu[1]:.2f} s")
        cores = os.cpu_count() or 1
        for kind in kinds:
            full_s = statistics.median(r[kind] for r in runs)
            net = full_s - empty_s
            written = int(runs[-1][f"{kind}_summary"].get("bytes") or 0)
            held = statistics.median(float(r[f"{kind}_summary"].get("longest_snapshot_s") or 0) for r in runs)
            label = {"binary": "chunked, binary (default)", "csv": "chunked, CSV (psycopg2)",
                     "shared": "--mode shared"}[kind]
            rechecked = sum(1 for r in runs if r[f"{kind}_summary"].get("rechecks_read"))
            print(f"  {label:<28} {full_s:8.2f} s   net {net:.2f} s, ratio {net / copy_s:.2f}x, "
                  f"{args.rows / max(net, 1e-9):,.0f} rows/s, {written / 1e6 / max(net, 1e-9):.1f} MB/s of Parquet "
                  f"({written / 1e6:.1f} MB), longest snapshot held {held:.2f} s"
                  + (f", recheck in {rechecked} of {len(runs)} rounds" if kind != "shared" else ""))
            net_cpu = [statistics.median(r[f"{kind}_cpu"][j] - r["empty_cpu"][j] for r in runs) for j in (0, 1)]
            print(f"    CPU less the empty run's: server {net_cpu[0]:.2f} s, client (JVM and Python workers) "
                  f"{net_cpu[1]:.2f} s; cpu ratio on {cores} cores {sum(net_cpu) / cores / max(copy_cpu[0], 1e-9):.2f}x")
        print("  gate: (snapshot - empty) / copy <= 1.0 for the default")
        if not args.skip_memory:
            small = _chunk_peak_kb(dsn, 100_000)
            large = _chunk_peak_kb(dsn, 1_000_000)
            print(f"  one chunk's peak RSS: 100k rows {small / 1024:.0f} MiB, 1M rows {large / 1024:.0f} MiB, "
                  f"ratio {large / small:.2f}x   (goal <= 1.25x)")
        conn.close()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
