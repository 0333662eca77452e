"""One batch: the task writes the staged batch, the driver gets its outcome back.

Where the task can reach the output (a local path or ``file:`` URI) it writes
the Parquet files itself with pyarrow, typed tables included, in a
one-partition RDD job whose ``collect()`` returns the outcome; elsewhere (or
with ``PGPOLL_WRITER=spark``) Spark's writer takes the task's Arrow batches
through ``mapInArrow`` and the outcome comes back in an accumulator (see
:mod:`pgpoll.sink.parquet_writer`). Nothing here publishes or advances: the
batch is only staged, under its plan (:mod:`pgpoll.sink.commit.batches`).

A small batch runs in the driver instead (``in_driver``): the same task
function, called in this process, with no Spark job. A Spark job costs
seconds of fixed time — scheduling, and on a run's first job the start of a
Python worker (about 4 s here) — while a batch of a few megabytes of WAL
decodes in well under a second; and an ingest run that finds nothing new
still peeks twice (the changes since the last run, then its own end-of-run
heartbeat). :func:`driver_batch_wal` says how much WAL the slot may be behind
for a batch to run in the driver: the batch can hold no more changes than
that WAL, so the driver's memory and time stay small (and a large
transaction still spills to a local file, as in an executor).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pgpoll import faults
from pgpoll.errors import ConfigError, SinkError, first_line
from pgpoll.ingest.batch_writes import pyarrow_task, spark_task, write_batch_here
from pgpoll.ingest.decode_ranges import decode_splits
from pgpoll.ingest.task import BatchOutcome, BatchSpec
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink, Plan
from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.parquet_writer import PYARROW, StagingTarget, choose_writer
from pgpoll.source.control import ControlConnection, retrying
from pgpoll.spark.filesystems import connector_hint
from pgpoll.spark.session import debug_requested
from pgpoll.stopping import StopRequest

log = logging.getLogger("pgpoll.ingest")

DRIVER_BATCH_ENV = "PGPOLL_DRIVER_BATCH_WAL"
"""Bytes of WAL the slot may be behind for a batch to run in the driver (``0``: every batch is a Spark job)."""

DRIVER_BATCH_WAL = 16 << 20
"""The default of :data:`DRIVER_BATCH_ENV`: 16 MiB of WAL, about 100,000 small row changes at most."""


#: "No limit": every batch of a local output runs in the driver (local Spark: an executor is this machine too).
EVERY_BATCH = 1 << 62


def driver_batch_wal(local_master: bool = False) -> int:
    """The WAL lag (bytes) up to which a batch runs in the driver (``PGPOLL_DRIVER_BATCH_WAL``).

    The default is 16 MiB, and no limit at all when Spark would run in local
    mode (``local_master``, :func:`pgpoll.spark.session.local_master_expected`):
    there a batch's single task would run on this machine anyway, only behind
    a Spark start-up and a Python worker's, so the driver runs every batch
    itself and a run never starts Spark.
    """
    raw = os.environ.get(DRIVER_BATCH_ENV, "").strip()
    if not raw:
        return EVERY_BATCH if local_master else DRIVER_BATCH_WAL
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{DRIVER_BATCH_ENV}={raw!r} is not a number of bytes",
                          f"set {DRIVER_BATCH_ENV} to a whole number of bytes (0: always a Spark job)")
    return value


class _Outcomes:
    """AccumulatorParam keeping the latest outcome reported by the batch task."""

    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 (Spark's name)
        a.update(b)
        return a


def cancel_quietly(spark: Any) -> None:
    """Cancel the batch's Spark job; Spark's log of its own cancellation (stack traces) is noise here."""
    if not debug_requested():
        spark.sparkContext.setLogLevel("OFF")
    spark.sparkContext.cancelAllJobs()


class StoppedError(Exception):
    """A stop was requested while a batch was in flight (its staging is discarded)."""


def run_batch(
    spark: Any, sink: BatchSink, plan: Plan, spec: BatchSpec, control: ControlConnection,
    stop: StopRequest | None = None, *, in_driver: bool = False,
) -> BatchOutcome:
    """One Spark job writing ``plan.staging``; returns the task's outcome (retried when transient).

    ``in_driver``: the pyarrow task runs in this process, no Spark job (``spark``
    may be None; the output must be one pyarrow reaches: see the module docstring).

    Where the task can reach the output (a local path or ``file:`` URI) it
    writes the Parquet files itself with pyarrow, typed tables included, in a
    one-partition RDD job whose ``collect()`` returns the outcome; elsewhere
    (or with ``PGPOLL_WRITER=spark``) Spark's writer takes the task's Arrow
    batches through ``mapInArrow`` and the outcome comes in an accumulator
    (see :mod:`pgpoll.sink.parquet_writer`). ``outcome.writer`` says which.

    Before every attempt the slot is re-advanced to the plan's high-water mark:
    a server crash can return the slot to its last checkpointed position, and a
    peek from there would show only changes the output already holds.
    """
    writer = PYARROW if in_driver else choose_writer(plan.staging)
    spec = replace(spec, splits=decode_splits(control, spec))  # temporary copies decode parts of it at once
    if sink.fs.direct_writes:  # an object store: spilled by the task, uploaded to the final keys
        spec = replace(spec, target=StagingTarget.uploaded(sink.fs, plan.id, sink.fs.path(layout.LEDGERS)))
    elif writer == PYARROW:
        spec = replace(spec, target=StagingTarget.of(
            plan.staging, plan.tables_staging, sink.fs.path(layout.LEDGERS)))
    for attempt in retrying(what=f"batch {spec.batch_number}"):
        with attempt:
            if spec.high_water_mark is not None:
                control.advance(Lsn(spec.high_water_mark))
            sink.clear_attempt(plan)  # a failed attempt's leftovers (the plan file stays)
            acc = None if in_driver else spark.sparkContext.accumulator({}, _Outcomes())
            collected: list[BatchOutcome] = []
            work = _batch_work(spark, spec, plan, writer, acc, collected, in_driver,
                               (lambda: stop.requested) if stop is not None else None)
            forget = (stop.on_request(lambda: cancel_quietly(spark)) if stop is not None and not in_driver
                      else (lambda: None))
            try:
                work()
                if in_driver and stop is not None and stop.requested:  # the task stopped early (see write_batch)
                    sink.discard(plan)
                    raise StoppedError()
            except StoppedError:
                raise
            except Exception as exc:
                if stop is not None and stop.requested:
                    sink.discard(plan)
                    raise StoppedError() from None
                if spec.fault in faults.TASK_POINTS:
                    faults.crash_if(spec.fault, spec.fault)
                sink.ensure_current(plan)  # lost already: another run's recovery may have removed the staging
                sink.discard(plan)
                raise SinkError(
                    f"writing the batch failed: {first_line(exc)}",
                    connector_hint(str(exc), sink.fs.root) or "check that the output is writable",
                ) from None
            finally:
                forget()
            outcome: BatchOutcome | None = (
                collected[0] if collected else acc.value.get("outcome") if acc is not None else None)
            if outcome is None:
                sink.discard(plan)
                raise SinkError("the batch task reported nothing", "check the Spark executor logs")
            if outcome.error is not None:
                sink.discard(plan)
                if outcome.reject is not None:
                    save_reject(sink, outcome.reject)
                raise outcome.error
            return outcome
    raise AssertionError("unreachable")  # pragma: no cover


def _batch_work(spark: Any, spec: BatchSpec, plan: Plan, writer: str, acc: Any, collected: list[BatchOutcome],
                in_driver: bool, stopped: Callable[[], bool] | None = None) -> Callable[[], None]:
    """What runs the batch: the task in this process, a pyarrow RDD job, or ``mapInArrow`` into Spark's writer."""
    if in_driver:
        return lambda: collected.append(write_batch_here(spec, stopped))
    if writer == PYARROW:
        job = spark.sparkContext.parallelize([0], 1).mapPartitions(pyarrow_task(spec))
        return lambda: collected.extend(job.collect())
    frame = spark.range(1, numPartitions=1).mapInArrow(spark_task(spec, acc), SPARK_DDL)
    return lambda: frame.write.mode("errorifexists").parquet(plan.staging)


def save_reject(sink: BatchSink, reject: dict[str, Any]) -> None:
    lsn = Lsn.parse(reject["lsn"])
    path = sink.fs.path(layout.REJECTS, f"{lsn.padded()}-{uuid.uuid4().hex[:8]}.json")
    sink.fs.write_text(path, json.dumps(reject, sort_keys=True))
    log.error("undecodable row saved to %s", path)
