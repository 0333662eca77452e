"""The performance report: one markdown table of the ingest gate, at the options users run, for each backlog shape.

For each shape (plugin, rows per transaction) ``--repeat`` runs side by
side on one throwaway server of :func:`bench_ingest.measure_backlog`: the
server's own decode (``count(*)`` over the same peek), an empty pgpoll run,
pgpoll at the **default options** (the gate: (drain - empty run) / server
decode, goal <= 2x; its batches and peak RSS), pgpoll as one batch
(``--batch-changes`` three times the backlog: the figure earlier rounds
published), ``--typed-tables`` at the defaults (typed / plain net of the
empty run, goal <= 1.25x), and the defaults with every batch a Spark job
(``PGPOLL_DRIVER_BATCH_WAL=0``, as on a cluster). Ratios are taken per run,
then their median. ``--baseline DIR`` adds another checkout's defaults and
one batch on the same backlogs (before and after in one run). Then one
transaction of ``--memory-rows`` rows at the defaults: the peak RSS a run
keeps whatever the backlog.

    python bench/report.py [--changes 1000000] [--shapes pgoutput:10000,test_decoding:10000,pgoutput:1000000]
                           [--repeat 3] [--baseline DIR] [--memory-rows 10000000] [--out bench/results/report.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyspark
from bench_ingest import measure_backlog, measure_memory, start_cluster

HERE = Path(__file__).resolve().parent
SHAPES = "pgoutput:10000,test_decoding:10000,pgoutput:1000000"


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, unit: str = " s", digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}{unit}"


def _row(runs: list[dict[str, Any]], changes: int, baseline: bool) -> str:
    def m(key: str, unit: str = " s", digits: int = 2) -> str:
        return _fmt(_median(runs, key), unit, digits)

    r = runs[0]
    shape = (f"{r['plugin']}, one {changes:,}-row transaction" if r["txn_rows"] >= changes
             else f"{r['plugin']}, {r['txn_rows']:,}-row transactions")
    cells = [
        shape, m("wal_mib", " MiB", 0), m("server_s"), m("pgpoll_empty_s"),
        f"{m('pgpoll_s')} ({m('batches', '', 0)})", f"**{m('ratio', 'x')}**", f"{m('one_s')}, {m('one_ratio', 'x')}",
        f"{m('typed_s')}, **{m('typed_ratio', 'x')}**",
        f"{m('pgpoll_empty_job_s')}, {m('spark_s')}, {m('spark_ratio', 'x')}", m("rss_mib", " MiB", 0),
    ]
    if baseline:
        cells += [f"{m('base_s')} ({m('base_batches', '', 0)}), {m('base_ratio', 'x')}", m("base_rss_mib", " MiB", 0),
                  m("base_one_ratio", "x")]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    """Measure, then print (and save) the markdown report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--shapes", default=SHAPES, help="plugin:rows-per-transaction, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another pgpoll checkout, run side by side")
    parser.add_argument("--memory-rows", type=int, default=10_000_000, help="0: no single-transaction memory run")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "report.md")
    args = parser.parse_args()
    shapes = [(p, int(n)) for p, _, n in (s.partition(":") for s in args.shapes.split(","))]
    cluster, inst = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="pgpoll-report-"))
    rows: list[str] = []
    loads = [os.getloadavg()[0]]
    memory = ""
    try:
        for plugin, txn_rows in shapes:
            changes = args.changes  # (a shape of at least that many rows per transaction is one transaction)
            runs = []
            for run in range(args.repeat):
                r = measure_backlog(cluster, changes, plugin, work, run, task=False, txn_rows=txn_rows,
                                    baseline=args.baseline)
                runs.append(r)
                loads.append(os.getloadavg()[0])
                print(f"  {plugin} {txn_rows:,}-row txns, run {run + 1}: server {r['server_s']:.2f} s, defaults "
                      f"{r['pgpoll_s']:.2f} s in {r['batches']} batch(es) = {r['ratio']:.2f}x, one batch "
                      f"{r['one_ratio']:.2f}x, typed / plain {r['typed_ratio']:.2f}x, RSS {r['rss_mib']:.0f} MiB"
                      + (f"; baseline {r['base_ratio']:.2f}x in {r['base_batches']} batch(es), RSS "
                         f"{r['base_rss_mib']:.0f} MiB" if args.baseline else "")
                      + f" (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
            rows.append(_row(runs, changes, args.baseline is not None))
        if args.memory_rows:
            mem = measure_memory(cluster, args.memory_rows, "pgoutput", work, baseline=args.baseline)
            loads.append(os.getloadavg()[0])
            memory = (f"Peak RSS of a run at the default options draining one {args.memory_rows:,}-row transaction "
                      f"(pgoutput): **{mem['mem_rss_mib']:.0f} MiB** ({mem['mem_s']:.1f} s)"
                      + (f"; baseline {mem['bmem_rss_mib']:.0f} MiB ({mem['bmem_s']:.1f} s)" if args.baseline else "")
                      + ".\n")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    header = ("| backlog | WAL | server decode | empty run | drain at the defaults (batches) | **gate at the defaults** "
              "(goal ≤ 2x) | one batch: drain, gate | `--typed-tables` at the defaults: drain, **typed / plain** "
              "(goal ≤ 1.25x) | every batch a Spark job: empty run, drain, (drain - empty) / server | peak RSS at the "
              "defaults |")
    if args.baseline is not None:
        header += " baseline defaults: drain (batches), gate | baseline peak RSS | baseline one batch: gate |"
    report = "\n".join([
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem_gib:.0f} GiB; PostgreSQL {inst.version}; "
        f"Spark {pyspark.__version__}; Python {platform.python_version()}. Medians of {args.repeat} runs of "
        f"{args.changes:,}-change backlogs of a 5-column table; load average {min(loads):.1f}-{max(loads):.1f}."
        + (f" Baseline: {args.baseline}." if args.baseline else ""),
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *rows,
        "",
        memory,
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    print(f"(saved to {args.out})")


if __name__ == "__main__":
    main()
