"""Materializing several tables at once, with the results and errors a one-by-one run gives.

A small table's materialize is a handful of small Spark jobs, and most of
its time is the driver's: planning queries, the Python-JVM round trips,
scheduling. Spark takes jobs from several driver threads at once, so the
tables of a run go to a few threads and one table's planning overlaps
another's jobs. Each table is independent of the others (its own state, its
own commit); the run stays one writer per destination (the lease is the
run's).

What the caller sees does not depend on the timing: :func:`run_in_order`
starts the tasks in order and returns their results in order; once one
fails, no task that has not started yet starts, every started one is waited
for, and the error raised is that of the first failed task *in order*: the
one a sequential loop would have raised, since every task before it started
(and so ran) too. Tasks after it that had already started finish: their
tables are written whole, as if the next run had done them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")

TABLE_THREADS = 4
"""How many tables a run materializes at once (Spark's task slots still bound the work that runs in parallel)."""


def run_in_order(tasks: Sequence[Callable[[], T]], threads: int | None = None) -> list[T]:
    """Run ``tasks`` on up to ``threads`` (default :data:`TABLE_THREADS`) threads; their results in order, or the
    first failed task's error (see the module docstring). One thread, or one task, runs them in this thread."""
    threads = TABLE_THREADS if threads is None else threads
    if threads <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    pool = ThreadPoolExecutor(max_workers=min(threads, len(tasks)), thread_name_prefix="pgpoll-table")
    futures: list[Future[T]] = []
    try:
        futures = [pool.submit(task) for task in tasks]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            for f in futures:
                f.cancel()  # only those not started yet: a started table finishes
        wait(futures)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    out: list[T] = []
    for f in futures:
        if f.cancelled():  # never before the failed task, whose error f.result() has raised already
            raise RuntimeError("a table was left out of the run while no earlier table failed")
        out.append(f.result())  # the task's error, if it failed
    return out
