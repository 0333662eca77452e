"""``make bench``: run every benchmark and print its figures.

Each benchmark starts its own throwaway PostgreSQL and prints its figures and
ratios; nothing here asserts anything (tests assert correctness, benchmarks
measure speed). ``PGPOLL_BENCH_CHANGES`` sets the largest backlog (default 1M),
``PGPOLL_BENCH_REPEAT`` the runs per measurement (default 3). The ingest
report (``bench/report.py``) shows the gate metric at the default options —
drain time minus an empty run, over the server's decode — beside the
one-batch figure, ``--typed-tables`` over plain, every batch a Spark job and
peak RSS, for pgoutput and test_decoding in 10,000-row transactions and
pgoutput in one transaction, then the peak RSS of one
``PGPOLL_BENCH_MEMORY_ROWS``-row transaction (default 10M); it is saved as
``bench/results/report.md``. ``PGPOLL_BENCH_BASELINE=DIR`` (another pgpoll
checkout) adds that tree's figures on the same backlogs. ``PGPOLL_WRITER=spark`` measures
Spark's Parquet writer (the fallback path) instead of the task's pyarrow one.
``bench_history.py`` times ``ingest`` start-up, an incremental ``materialize``,
``status`` and ``batches`` at 1,000 and 10,000 committed batches (goal: flat).
``bench_parallel.py`` drains the same backlogs with ``--decode-parallelism`` 1, 2
and 3 side by side, beside the server's decode as one peek and as the slot plus a temporary copy
(goals: <= 1.5x and <= 0.7x of one peek), and the CPU each drain costs the client and the server.
``bench_stream.py`` sets a Spark stream's availableNow drain
(``spark.readStream.format("pgpoll")``) beside ``pgpoll ingest`` with every
batch a Spark job (goal <= 1.5x, each net of its empty run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run the decode and ingest benchmarks one after the other."""
    changes = os.environ.get("PGPOLL_BENCH_CHANGES", "1000000")
    repeat = os.environ.get("PGPOLL_BENCH_REPEAT", "3")
    runs = [
        [sys.executable, str(HERE / "bench_decode.py"), "--changes", changes],
        [sys.executable, str(HERE / "bench_test_decoding.py"), "--lines", changes],
        [sys.executable, str(HERE / "report.py"), "--changes", changes, "--repeat", repeat,
         "--memory-rows", os.environ.get("PGPOLL_BENCH_MEMORY_ROWS", "10000000"),
         *(["--baseline", os.environ["PGPOLL_BENCH_BASELINE"]] if os.environ.get("PGPOLL_BENCH_BASELINE") else [])],
        [sys.executable, str(HERE / "bench_parallel.py"), "--changes", changes, "--repeat", repeat],
        [sys.executable, str(HERE / "bench_typed.py"), "--changes", "100000"],
        [sys.executable, str(HERE / "bench_startup.py"), "--batches", "10,10000", "--repeat", repeat],
        [sys.executable, str(HERE / "bench_history.py"), "--batches", "1000,10000", "--repeat", repeat],
        [sys.executable, str(HERE / "bench_snapshot.py"), "--rows", os.environ.get("PGPOLL_BENCH_SNAPSHOT_ROWS", "2000000"),
         "--repeat", repeat],
        [sys.executable, str(HERE / "bench_delta.py"), "--rows", os.environ.get("PGPOLL_BENCH_DELTA_ROWS", "2000000"), "--small"],
        [sys.executable, str(HERE / "bench_iceberg.py"), "--rows", os.environ.get("PGPOLL_BENCH_DELTA_ROWS", "2000000")],
        [sys.executable, str(HERE / "bench_stream.py"), "--changes", changes, "--repeat", repeat],
        [sys.executable, str(HERE / "bench_store.py"), "--changes", changes, "--repeat", repeat],
    ]
    status = 0
    for cmd in runs:
        print(f"\n$ {' '.join(Path(c).name if c.endswith('.py') else c for c in cmd[1:])}", flush=True)
        status |= subprocess.run(cmd).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
