"""Where a snapshot's chunks run: Spark tasks, or threads of the driver when Spark would be local anyway.

A snapshot's chunk tasks (:func:`pgpoll.snapshot.chunk_task.run_chunks`) need
nothing of Spark but somewhere to run: each reads its chunks on one connection
and publishes them into the output. When Spark would run in local mode (its
executors are this machine) and the driver reaches the output itself (a local
path or an object store), a Spark job only adds a JVM's start-up (about 7 s
here) and a Python worker's in front of the same work: an empty table's
snapshot took about 12 s against about 2 s for an empty ingest run. So
there, the driver runs the chunk tasks itself, in ``parallelism`` threads
(the same bound on connections reading at once as Spark's partitions); the
reads (ADBC, in C++) and the Parquet writes (pyarrow) release the GIL.

``PGPOLL_SNAPSHOT_ENGINE`` chooses: ``auto`` (the default, as above),
``driver`` (always the driver's threads; the output must be one the driver
reaches) or ``spark`` (always Spark jobs, as on a cluster).

A stop (SIGINT/SIGTERM) is seen between chunks: no thread starts another
chunk, and the run returns at once without waiting for chunks under way
(the threads are daemons; a chunk is published by one create-if-absent, so
one cut short leaves nothing a reader or the next run takes for finished).
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pgpoll import stopping
from pgpoll.errors import ConfigError, PgpollError, SinkError, first_line
from pgpoll.snapshot.chunk_task import ChunkResult, ChunkWork, run_chunks
from pgpoll.stopping import StopRequest

Runner = Callable[[Sequence[ChunkWork], int, "StopRequest | None"], list[ChunkResult]]
"""Runs chunk works with a parallelism and returns their results (the first chunk error raised)."""

ENGINE_ENV = "PGPOLL_SNAPSHOT_ENGINE"
ENGINES = ("auto", "driver", "spark")
POLL_S = 0.1


def requested_engine(environ: dict[str, str] | None = None) -> str:
    """``PGPOLL_SNAPSHOT_ENGINE`` (default ``auto``); any other value is a ConfigError (exit 2)."""
    value = (environ if environ is not None else dict(os.environ)).get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if value not in ENGINES:
        raise ConfigError(f"{ENGINE_ENV}={value!r} is not one of {', '.join(ENGINES)}",
                          f"unset {ENGINE_ENV} (auto: the driver's threads when Spark would be local, else Spark)")
    return value


def in_driver(engine: str, *, driver_reaches_output: bool, local_master: bool) -> bool:
    """Whether the chunks run in the driver's threads (see the module's docstring)."""
    if engine == "driver":
        if not driver_reaches_output:
            raise ConfigError(f"{ENGINE_ENV}=driver needs an output the driver writes itself (a local path, s3://, "
                              "gs://, az://)", f"unset {ENGINE_ENV} for this output")
        return True
    return engine == "auto" and driver_reaches_output and local_master


def run_as_spark_job(spark: Any, works: Sequence[ChunkWork], parallelism: int, stop: StopRequest | None) -> list[ChunkResult]:
    """One Spark job over ``works``; the first task error is raised (finished chunks stay published)."""
    if not works:
        return []
    sc = spark.sparkContext
    job = sc.parallelize(list(works), numSlices=max(1, min(parallelism, len(works)))).mapPartitions(run_chunks)
    forget = stop.on_request(lambda: _cancel(spark)) if stop is not None else (lambda: None)
    try:
        results: list[ChunkResult] = job.collect()
    except Exception as exc:
        if stop is not None and stop.requested:
            raise stopping.StopRequestedError() from None
        raise SinkError(f"a snapshot task failed: {first_line(exc)}", "check the Spark executor logs; rerun to resume") from None
    finally:
        forget()
    for result in results:
        if result.error is not None:
            raise result.error
    return results


def _cancel(spark: Any) -> None:
    from pgpoll.spark.session import debug_requested

    if not debug_requested():
        spark.sparkContext.setLogLevel("OFF")  # Spark's log of its own cancellation is noise here
    spark.sparkContext.cancelAllJobs()


def choose_runner(spark: Any, output: str, stop: StopRequest | None) -> tuple[Runner, int]:
    """How this run's chunks run (the module's docstring), and its default parallelism; starts Spark if needed."""
    from pgpoll.sink.stores.filesystem import needs_spark
    from pgpoll.spark.session import local_master_expected

    if in_driver(requested_engine(), driver_reaches_output=not needs_spark(output),
                 local_master=local_master_expected(spark)):
        return run_in_driver, os.cpu_count() or 1
    from pgpoll.spark.session import spark_session

    spark = spark or spark_session("pgpoll-snapshot")
    stopping.reclaim(stop)  # SparkContext replaced the SIGINT handler with its own
    return functools.partial(run_as_spark_job, spark), int(spark.sparkContext.defaultParallelism)


def run_in_driver(works: Sequence[ChunkWork], parallelism: int, stop: StopRequest | None) -> list[ChunkResult]:
    """Run ``works`` in up to ``parallelism`` threads of this process; the first chunk error is raised.

    Each thread takes the next chunk from one queue and reads it on its own
    connection (:func:`run_chunks` keeps one per thread), so at most
    ``parallelism`` connections read at once, as with Spark's partitions.
    """
    if not works:
        return []
    pending: queue.SimpleQueue[ChunkWork] = queue.SimpleQueue()
    for work in works:
        pending.put(work)
    results: list[ChunkResult] = []
    failures: list[BaseException] = []
    halt = threading.Event()  # a chunk failed or a stop came: no thread takes another chunk
    lock = threading.Lock()

    def feed() -> Iterator[ChunkWork]:
        while not halt.is_set() and (stop is None or not stop.requested):
            try:
                yield pending.get_nowait()
            except queue.Empty:
                return

    def worker() -> None:
        try:
            for result in run_chunks(feed()):
                with lock:
                    results.append(result)
                if result.error is not None:
                    halt.set()
        except BaseException as exc:  # a bug, not a chunk's PgpollError (run_chunks reports those): the run stops
            with lock:
                failures.append(exc)
            halt.set()

    threads = [threading.Thread(target=worker, name=f"pgpoll-snapshot-{i}", daemon=True)
               for i in range(max(1, min(parallelism, len(works))))]
    for thread in threads:
        thread.start()
    while alive := [thread for thread in threads if thread.is_alive()]:
        if stop is not None and stop.requested:
            raise stopping.StopRequestedError()  # chunks under way are left to the daemon threads (see above)
        alive[0].join(POLL_S)
    if stop is not None and stop.requested:
        raise stopping.StopRequestedError()
    if failures:
        raise SinkError(f"a snapshot task failed: {first_line(failures[0])}", "rerun to resume") from failures[0]
    errors = [r.error for r in results if r.error is not None]
    if errors:
        first: PgpollError = errors[0]
        raise first
    return results
