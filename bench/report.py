"""The performance report: one markdown table from one run of every ingest measurement.

For each plugin and backlog size, ``--repeat`` runs side by side on one
throwaway server — the server's own decode (``count(*)`` over the same peek),
``pg_recvlogical`` to a file, pgpoll end to end as a real ``jobs/ingest.py``
process as users run it, plain and with ``--typed-tables``, pgpoll on an
empty slot, and the drain with every batch a Spark job against an empty run
of that kind — then medians, and ratios taken per run before their
median: the gate metric (drain time minus the empty run, over the server's
decode; goal <= 3x) and typed / plain (both net of the empty run; goal
<= 1.25x), side by side. Also: the batch task's peak memory
for one 200k-row and one 2M-row transaction, and an empty ``spark-submit``
next to an empty pgpoll run.

    python bench/report.py [--sizes 100000,1000000] [--repeat 3] [--out bench/results/report.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyspark
from bench_ingest import measure_backlog, measure_memory

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

HERE = Path(__file__).resolve().parent


def _empty_spark_submit(work: Path) -> float:
    script = work / "empty.py"
    script.write_text("from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate().stop()\n")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    started = time.perf_counter()
    subprocess.run([str(submit), "--master", "local[*]", str(script)], check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, unit: str = " s") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def main() -> None:
    """Measure, then print (and save) the markdown report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plugins", default="pgoutput,test_decoding")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "report.md")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={"max_wal_size": "4GB", "work_mem": "64MB"}).start()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-report-"))
    rows: list[str] = []
    try:
        for plugin in args.plugins.split(","):
            for size in sizes:
                runs = []
                for run in range(args.repeat):
                    r = measure_backlog(cluster, size, plugin, work, run, task=False)
                    r["batch_ratio"] = r["batch_s"] / r["server_s"]
                    runs.append(r)
                    print(f"  {plugin} {size:,} run {run + 1}: server {r['server_s']:.2f} s, "
                          f"pgpoll batches {r['batch_s']:.2f} s, gate {r['ratio']:.2f}x, "
                          f"typed / plain {r['typed_ratio']:.2f}x (writer {r['writer']})",
                          file=sys.stderr, flush=True)
                rows.append(
                    f"| {plugin} | {size:,} | {_fmt(_median(runs, 'server_s'))} | {_fmt(_median(runs, 'recvlogical_s'))} "
                    f"| {_fmt(_median(runs, 'pgpoll_s'))} | {_fmt(_median(runs, 'typed_s'))} "
                    f"| {_fmt(_median(runs, 'pgpoll_empty_s'))} | {_fmt(_median(runs, 'pgpoll_empty_job_s'))} / "
                    f"{_fmt(_median(runs, 'spark_s'))} "
                    f"| {_fmt(_median(runs, 'batch_s'))} | {_fmt(_median(runs, 'ratio'), 'x')} "
                    f"| {_fmt(_median(runs, 'spark_ratio'), 'x')} "
                    f"| {_fmt(_median(runs, 'typed_ratio'), 'x')} |"
                )
        memory = ""
        if not args.skip_memory:
            small = measure_memory(cluster, 200_000, "pgoutput", work)
            large = measure_memory(cluster, 2_000_000, "pgoutput", work)
            memory = (f"Batch task peak memory (pgoutput): one 200k-row transaction {small / 1024:.0f} MiB, "
                      f"one 2M-row transaction {large / 1024:.0f} MiB = {large / small:.2f}x (goal <= 1.25x).\n")
        empty_submit = _empty_spark_submit(work)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    report = "\n".join([
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem_gib:.0f} GiB; PostgreSQL {inst.version}; "
        f"Spark {pyspark.__version__}; Python {platform.python_version()}. Medians of {args.repeat} runs; "
        "backlogs of a 5-column table in 10,000-row transactions.",
        "",
        "| plugin | changes | server decode | pg_recvlogical | pgpoll end to end | with --typed-tables "
        "| pgpoll empty run | batches as Spark jobs: empty run / drain | pgpoll batches | gate: (drain - empty) "
        "/ server | every batch a Spark job: (drain - empty) / server | typed / plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        memory + f"An empty `spark-submit` (start a SparkSession, stop it) took {empty_submit:.2f} s.",
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    print(f"(saved to {args.out})")


if __name__ == "__main__":
    main()
