"""Benchmark: start-up with 10 and with 10,000 committed batches, side by side (the throughput issue's "flat" goal).

Each output is built with the real commit-log classes (records serialised by
``CommitRecord.to_json`` under their real names, a checkpoint every
``CHECKPOINT_EVERY`` records written by ``CommitLog.write_checkpoint``, one
partition directory per batch under ``changes/`` and ``tables/public.t/``),
then, medians of ``--repeat`` runs:

* **start-up** — what a run does with the output before and around an empty
  batch: the writable check, recovery at start, a plan and its discard —
  through the local filesystem (no JVM) and through Hadoop's ``FileSystem``
  in a SparkSession (what ``jobs/ingest.py`` uses, over py4j);
* the same **without the pointer** (``_pgpoll/newest-checkpoint.json`` removed
  before each run): the commit log listed and recovery's full pass over every
  partition, which is what every start did before the pointer;
* **an empty ``jobs/ingest.py`` run** on a throwaway PostgreSQL (a real
  process, its own Spark; test_decoding, an empty slot).

    python bench/bench_startup.py [--batches 10,10000] [--repeat 3] [--skip-spark] [--skip-ingest]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink
from pgpoll.sink.commit.log import CHECKPOINT_EVERY, POINTER, CommitLog, CommitRecord, LogState, record_name
from pgpoll.sink.stores.filesystem import OutputFs
from pgpoll.sink.stores.local import LocalOutputFs

FILE = "part-00000.parquet"
TABLE = "public.t"


def build(root: Path, batches: int) -> None:
    """``batches`` committed batches of one row each, LSNs far below a new server's (they are history)."""
    log = CommitLog(LocalOutputFs(str(root)))
    (root / layout.COMMITS).mkdir(parents=True)
    checkpoint = None
    tail: list[CommitRecord] = []
    for seq in range(1, batches + 1):
        start, end = seq * 0x10, seq * 0x10 + 8
        partition = layout.partition_name(start, end)
        for directory in (root / layout.CHANGES / partition, root / layout.TABLES / TABLE / partition):
            directory.mkdir(parents=True)
            (directory / FILE).write_bytes(b"PAR1")
        record = CommitRecord(
            start=str(Lsn(start)), end=str(Lsn(end)), rows=1, files=[FILE], partition=partition, slot="bench",
            plugin="test_decoding", seq=seq, prev=seq - 1 or None, file_sizes={FILE: 4}, bytes=4, tables=[TABLE],
            table_files={TABLE: {FILE: 4}}, staging=f"staging-{seq}",
        )
        (root / layout.COMMITS / record_name(seq)).write_text(record.to_json())  # a plain write: fast to build
        tail.append(record)
        if len(tail) >= CHECKPOINT_EVERY:
            state = LogState(head=seq, checkpoint=checkpoint, tail=tuple(tail))
            log.write_checkpoint(state, seq)
            checkpoint, tail = state.fold(seq), []


def start_up(fs: OutputFs, root: str, spark: Any = None) -> None:
    """What a run does with its output at start and for an empty batch."""
    sink = BatchSink(spark, root, fs=fs)
    sink.check_writable()
    sink.recover()
    plan = sink.plan()
    sink.discard(plan)


def timed(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    """The median of ``repeat`` timings of ``fn`` (``before`` runs untimed before each)."""
    runs = []
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def measure_fs(name: str, make_fs: Callable[[str], OutputFs], outputs: dict[int, Path], repeat: int,
               spark: Any = None) -> dict[tuple[str, int], float]:
    """Start-up with and without the pointer, on each output."""
    out: dict[tuple[str, int], float] = {}
    for batches, root in outputs.items():
        pointer = root / layout.META / POINTER  # absent below CHECKPOINT_EVERY batches: both rows then list
        saved = pointer.read_text() if pointer.exists() else None
        out[(f"{name}: start-up", batches)] = timed(lambda r=root: start_up(make_fs(str(r)), str(r), spark), repeat)
        out[(f"{name}: start-up without the pointer (as before)", batches)] = timed(
            lambda r=root: start_up(make_fs(str(r)), str(r), spark), repeat,
            before=lambda p=pointer: p.unlink(missing_ok=True))
        if saved is not None:
            pointer.write_text(saved)
    return out


def measure_ingest(outputs: dict[int, Path], repeat: int) -> dict[tuple[str, int], float]:
    """An empty ``jobs/ingest.py`` run per output on a throwaway server (test_decoding, an empty slot)."""
    import psycopg2
    from bench_ingest import _slot, ingest_run

    from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

    found = find_bindirs()
    cluster = ThrowawayCluster(found.get(15) or found[max(found)]).start()
    out: dict[tuple[str, int], float] = {}
    try:
        conn = psycopg2.connect(cluster.dsn())
        conn.autocommit = True
        runs: dict[int, list[float]] = {b: [] for b in outputs}
        for batches in outputs:
            _slot(conn, f"empty_{batches}", "test_decoding")
        for _ in range(repeat):  # interleaved, so a change of load hits both sizes alike
            for batches, root in outputs.items():
                seconds, _summary, _rss = ingest_run(cluster.dsn(), f"empty_{batches}", str(root), "test_decoding",
                                                     keep=True)
                runs[batches].append(seconds)
        conn.close()
        out = {("empty jobs/ingest.py run (Spark's start included)", b): statistics.median(r) for b, r in runs.items()}
    finally:
        cluster.stop()
    return out


def main() -> None:
    """Build the outputs, measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="10,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-spark", action="store_true", help="no SparkSession: the local filesystem only")
    parser.add_argument("--skip-ingest", action="store_true", help="no throwaway server, no real ingest run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-startup-"))
    try:
        outputs: dict[int, Path] = {}
        figures: dict[tuple[str, int], float] = {}
        for batches in sizes:
            outputs[batches] = work / f"out{batches}"
            started = time.perf_counter()
            build(outputs[batches], batches)
            print(f"built {batches:,} batches in {time.perf_counter() - started:.1f} s", flush=True)
            started = time.perf_counter()
            start_up(LocalOutputFs(str(outputs[batches])), str(outputs[batches]))
            figures[("local: first start (the full pass, once)", batches)] = time.perf_counter() - started
        figures.update(measure_fs("local", LocalOutputFs, outputs, args.repeat))
        if not args.skip_spark:
            from pgpoll.sink.stores.hadoop import HadoopOutputFs
            from pgpoll.spark.session import spark_session

            spark = spark_session("pgpoll-bench-startup")
            try:
                figures.update(measure_fs("Hadoop FileSystem (py4j)", lambda r: HadoopOutputFs(spark, r), outputs,
                                          args.repeat, spark))
            finally:
                spark.stop()
        if not args.skip_ingest:
            figures.update(measure_ingest(outputs, args.repeat))
        small, large = min(sizes), max(sizes)
        print(f"\nstart-up with {small:,} and {large:,} committed batches; medians of {args.repeat} run(s); "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        print(f"| measurement | {small:,} batches | {large:,} batches | difference |")
        print("|---|---:|---:|---:|")
        for what in dict.fromkeys(k for k, _b in figures):
            a, b = figures.get((what, small)), figures.get((what, large))
            if a is not None and b is not None:
                print(f"| {what} | {a:.3f} s | {b:.3f} s | {b - a:+.3f} s |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
