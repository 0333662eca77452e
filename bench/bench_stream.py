"""Benchmark: a Spark stream's availableNow drain against ``pgpoll ingest`` of the same backlog.

On one throwaway server, one backlog (``--changes`` changes in transactions
of ``--txn-rows`` rows) and a pair of slots per run, side by side:

* **stream**: a Spark application (this file with ``--run-query``, its own
  process, as a scheduled job) running ``spark.readStream.format("pgpoll")``
  with ``trigger(availableNow=True)`` into a Parquet file sink, with the
  source's defaults (one batch for the whole backlog; ``--max-rows`` sets
  ``maxRowsPerTrigger``);
* **ingest**: ``jobs/ingest.py`` with ``PGPOLL_DRIVER_BATCH_WAL=0``, so every
  batch is a Spark job too (the default ``--batch-changes``);

each net of its own empty run (the same process on a slot with nothing to
speak of: Spark's start-up, and a first Spark job: ingest's empty run ends
with its heartbeat batch, a Spark job here; the stream's reads one one-row
transaction, as a stream with nothing at all runs no batch), medians of
``--repeat`` runs, and the ratio stream / ingest (goal <= 1.5x). A first
Spark job in a fresh JVM costs seconds (class loading, JIT, Python workers),
which both empty runs include. Without a limit the stream's run is one batch
whose end is a non-transactional message the run writes before it starts
(:func:`pgpoll.source.commit_boundaries.mark_boundary`): no decode on the
driver. With ``--max-rows`` the driver finds where each batch ends with a
decode (the server aggregates the peek and ships one row:
:func:`pgpoll.source.commit_boundaries.next_boundary`); those decodes are inside
the stream's time, and are also shown on their own (the same calls on the
backlog, batch after batch, without Spark).

Also shown: Spark's own Parquet writer on the change rows ingest wrote
(``--run-copy``: read and cached, then written as the file sink writes them,
after a one-row write): the part of the stream's time that no source can
remove, since a stream's rows reach a Parquet sink through it, while ingest
writes its files with pyarrow.

    python bench/bench_stream.py [--changes 1000000] [--plugin pgoutput] [--repeat 3] [--txn-rows 10000] [--max-rows N]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import _fill, _fresh_table, _slot, _sql  # noqa: E402 (the same backlog as the ingest benchmark)


def run_query(spec: dict[str, Any]) -> None:
    """The stream application (``--run-query``): drain one slot with availableNow into a Parquet sink."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import pgpoll.spark

    spark = (SparkSession.builder.appName("pgpoll-bench-stream").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pgpoll.spark.register(spark)
    reader = spark.readStream.format("pgpoll").option("slot", spec["slot"])
    if spec.get("publication"):
        reader = reader.option("publication", spec["publication"])
    if spec.get("maxRowsPerTrigger"):
        reader = reader.option("maxRowsPerTrigger", str(spec["maxRowsPerTrigger"]))
    query = (reader.load().writeStream.format("parquet").option("path", spec["path"])
             .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    query.awaitTermination()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(json.dumps({"rows": rows, "batches": sum(1 for p in query.recentProgress if p["numInputRows"])}))
    spark.stop()


def run_copy(spec: dict[str, Any]) -> None:
    """Spark's own Parquet writer on the change rows ``pgpoll ingest`` wrote (``--run-copy``): the part of the
    stream's time no source can remove, since a stream's rows reach a file sink through it.

    The rows are read and cached first (not timed), then written once as a Parquet file sink writes them; a
    one-row write first loads the writer's classes, as the stream's empty run does.
    """
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.appName("pgpoll-bench-stream-copy").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.read.parquet(*spec["files"]).cache()
    count = rows.count()
    rows.limit(1).write.parquet(spec["path"] + "_warm")
    started = time.perf_counter()
    rows.write.parquet(spec["path"])
    seconds = time.perf_counter() - started
    print(json.dumps({"rows": count, "write_s": seconds}))
    spark.stop()


def _copy(ingest_out: Path, work: Path) -> float:
    """Seconds Spark's Parquet writer takes for the change rows of ``ingest_out`` (:func:`run_copy`)."""
    files = sorted(str(f) for f in ingest_out.glob("changes/lsn_range=*/*.parquet"))
    spec = {"files": files, "path": str(work / "copy")}
    proc = subprocess.run([sys.executable, __file__, "--run-copy", json.dumps(spec)], capture_output=True, text=True,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    if proc.returncode != 0:
        raise SystemExit(f"copy failed ({proc.returncode}): {proc.stderr[-3000:]}")
    shutil.rmtree(work / "copy", ignore_errors=True)
    shutil.rmtree(work / "copy_warm", ignore_errors=True)
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["write_s"])


def _stream(dsn: str, slot: str, plugin: str, work: Path, max_rows: int | None) -> tuple[float, dict[str, Any]]:
    spec = {"slot": slot, "path": str(work / f"sink_{slot}"), "checkpoint": str(work / f"ck_{slot}"),
            "publication": "bench_pub" if plugin == "pgoutput" else None, "maxRowsPerTrigger": max_rows}
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--run-query", json.dumps(spec)], capture_output=True, text=True,
                          env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"stream failed ({proc.returncode}): {proc.stderr[-3000:]}")
    shutil.rmtree(spec["path"], ignore_errors=True)
    shutil.rmtree(spec["checkpoint"], ignore_errors=True)
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def _ingest(dsn: str, slot: str, plugin: str, work: Path, keep: bool = False) -> tuple[float, dict[str, Any]]:
    args = [sys.executable, str(REPO / "jobs" / "ingest.py"), "--slot", slot, "--output", str(work / f"out_{slot}")]
    if plugin == "pgoutput":
        args += ["--publication", "bench_pub"]
    env = dict(os.environ, PGPOLL_DSN=dsn, PYSPARK_PYTHON=sys.executable, PGPOLL_DRIVER_BATCH_WAL="0")
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed ({proc.returncode}): {proc.stderr[-3000:]}")
    if not keep:
        shutil.rmtree(work / f"out_{slot}", ignore_errors=True)
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def _boundary_decode(dsn: str, slot: str, plugin: str, max_rows: int) -> float:
    """The driver's decodes that find each batch's end under ``maxRowsPerTrigger``, on their own (no Spark).

    As the stream does: find an end, move the slot there, find the next, until nothing is left.
    """
    from pgpoll.lsn import Lsn
    from pgpoll.source import slots
    from pgpoll.source.commit_boundaries import next_boundary
    from pgpoll.source.connection import connect, resolve_dsn

    conn = connect(resolve_dsn(dsn))
    try:
        options = slots.peek_options(plugin, publications=["bench_pub"] if plugin == "pgoutput" else None)
        after = Lsn(slots.get_slot(conn, slot).confirmed_flush_lsn or 0)
        started = time.perf_counter()
        while (end := next_boundary(conn, slot, plugin, options, after=after, max_changes=max_rows).end) is not None:
            slots.advance_slot(conn, slot, end)
            after = end
        return time.perf_counter() - started
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--plugin", choices=["pgoutput", "test_decoding"], default="pgoutput")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--txn-rows", type=int, default=10_000)
    parser.add_argument("--max-rows", type=int, default=None, help="the stream's maxRowsPerTrigger (default: none)")
    parser.add_argument("--run-query", help=argparse.SUPPRESS)
    parser.add_argument("--run-copy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_query:
        run_query(json.loads(args.run_query))
        return
    if args.run_copy:
        run_copy(json.loads(args.run_copy))
        return
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={"max_wal_size": "4GB", "work_mem": "64MB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-stream-"))
    load_before = os.getloadavg()[0]
    try:
        dsn = cluster.dsn()
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        _fresh_table(conn)
        runs = range(args.repeat)
        for run in runs:
            for kind in ("str", "ing", "dec"):
                _slot(conn, f"{kind}_{run}", args.plugin)
        _fill(conn, args.changes, args.txn_rows)
        for run in runs:
            _slot(conn, f"nst_{run}", args.plugin)
        _fill(conn, 1, 1, start=args.changes)  # the stream's "empty" run reads this one change (see the docstring)
        for run in runs:
            _slot(conn, f"nin_{run}", args.plugin)
        results = []
        for run in runs:
            decode_s = _boundary_decode(dsn, f"dec_{run}", args.plugin, args.max_rows) if args.max_rows else 0.0
            empty_stream_s, _ = _stream(dsn, f"nst_{run}", args.plugin, work, args.max_rows)
            stream_s, stream_summary = _stream(dsn, f"str_{run}", args.plugin, work, args.max_rows)
            empty_ingest_s, _ = _ingest(dsn, f"nin_{run}", args.plugin, work)
            ingest_s, ingest_summary = _ingest(dsn, f"ing_{run}", args.plugin, work, keep=True)
            copy_s = _copy(work / f"out_ing_{run}", work)
            shutil.rmtree(work / f"out_ing_{run}", ignore_errors=True)
            if stream_summary["rows"] != ingest_summary["changes"]:
                raise SystemExit(f"the stream read {stream_summary['rows']} changes, ingest wrote {ingest_summary['changes']}")
            results.append({
                "decode_s": decode_s, "stream_s": stream_s, "empty_stream_s": empty_stream_s, "ingest_s": ingest_s,
                "empty_ingest_s": empty_ingest_s, "stream_net_s": stream_s - empty_stream_s,
                "ingest_net_s": ingest_s - empty_ingest_s, "copy_s": copy_s, "batches": stream_summary["batches"],
                "ingest_batches": ingest_summary["batches"],
                "ratio": (stream_s - empty_stream_s) / max(ingest_s - empty_ingest_s, 1e-9),
            })
            for kind in ("str", "ing", "dec", "nst", "nin"):
                _sql(conn, "SELECT pg_drop_replication_slot(%s)", (f"{kind}_{run}",))
        conn.close()

        def m(key: str) -> float:
            return float(statistics.median(r[key] for r in results))

        print(f"PostgreSQL {inst.version}, plugin {args.plugin}, backlog {args.changes:,} changes in {args.txn_rows:,}-row "
              f"transactions; medians of {args.repeat} run(s); {os.cpu_count()} cores, load average {load_before:.1f} "
              f"before, {os.getloadavg()[0]:.1f} after")
        limit = f"maxRowsPerTrigger {args.max_rows:,}" if args.max_rows else "no maxRowsPerTrigger"
        print(f"  stream, availableNow into a Parquet sink ({limit}, {m('batches'):.0f} batch(es)): "
              f"{m('stream_s'):.2f} s, empty run {m('empty_stream_s'):.2f} s, net {m('stream_net_s'):.2f} s")
        if args.max_rows:
            print(f"  of which the driver's decodes finding each batch's end (alone, no Spark): {m('decode_s'):.2f} s")
        else:
            print("  no decode on the driver: the run's one batch ends at a message the run writes")
        print(f"  pgpoll ingest, PGPOLL_DRIVER_BATCH_WAL=0 ({m('ingest_batches'):.0f} batches, each a Spark job): "
              f"{m('ingest_s'):.2f} s, empty run {m('empty_ingest_s'):.2f} s, net {m('ingest_net_s'):.2f} s")
        print(f"  Spark's Parquet writer alone on ingest's change rows (cached, then written as the file sink writes): "
              f"{m('copy_s'):.2f} s = {m('copy_s') / max(m('ingest_net_s'), 1e-9):.2f}x ingest's net "
              "(a part of the stream's time no source removes)")
        print(f"  stream / ingest, each net of its empty run: {m('ratio'):.2f}x (goal <= 1.5x); per run: "
              + ", ".join(f"{r['ratio']:.2f}x ({r['stream_net_s']:.1f} s / {r['ingest_net_s']:.1f} s)" for r in results))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
