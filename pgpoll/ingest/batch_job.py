"""One batch as one Spark job: the task writes the staged batch, the driver gets its outcome back.

Where the task can reach the output (a local path or ``file:`` URI) it writes
the Parquet files itself with pyarrow, typed tables included, in a
one-partition RDD job whose ``collect()`` returns the outcome; elsewhere (or
with ``PGPOLL_WRITER=spark``) Spark's writer takes the task's Arrow batches
through ``mapInArrow`` and the outcome comes back in an accumulator (see
:mod:`pgpoll.sink.parquet_writer`). Nothing here publishes or advances: the
batch is only staged, under its plan (:mod:`pgpoll.sink.batches`).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from typing import Any

from pgpoll.errors import SinkError, first_line
from pgpoll.ingest import faults
from pgpoll.ingest.task import BatchOutcome, BatchSpec, pyarrow_task, spark_task
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.batches import BatchSink, Plan
from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.parquet_writer import PYARROW, StagingTarget, choose_writer
from pgpoll.source.control import ControlConnection, retrying
from pgpoll.spark.filesystems import connector_hint
from pgpoll.spark.session import debug_requested
from pgpoll.stopping import StopRequest

log = logging.getLogger("pgpoll.ingest")


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
    stop: StopRequest | None = None,
) -> BatchOutcome:
    """One Spark job writing ``plan.staging``; returns the task's outcome (retried when transient).

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
    writer = choose_writer(plan.staging)
    if writer == PYARROW:
        spec = replace(spec, target=StagingTarget.of(
            plan.staging, plan.tables_staging, sink.fs.path(layout.LEDGERS)))
    for attempt in retrying(what=f"batch {spec.batch_number}"):
        with attempt:
            if spec.high_water_mark is not None:
                control.advance(Lsn(spec.high_water_mark))
            sink.fs.delete(plan.staging)  # a failed attempt's leftovers (the plan file stays)
            sink.fs.delete(plan.tables_staging)
            acc = spark.sparkContext.accumulator({}, _Outcomes())
            collected: list[BatchOutcome] = []
            if writer == PYARROW:
                job = spark.sparkContext.parallelize([0], 1).mapPartitions(pyarrow_task(spec))
            else:
                frame = spark.range(1, numPartitions=1).mapInArrow(spark_task(spec, acc), SPARK_DDL)
            forget = stop.on_request(lambda: cancel_quietly(spark)) if stop is not None else (lambda: None)
            try:
                if writer == PYARROW:
                    collected.extend(job.collect())
                else:
                    frame.write.mode("errorifexists").parquet(plan.staging)
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
            outcome: BatchOutcome | None = collected[0] if collected else acc.value.get("outcome")
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


def save_reject(sink: BatchSink, reject: dict[str, Any]) -> None:
    lsn = Lsn.parse(reject["lsn"])
    path = sink.fs.path(layout.REJECTS, f"{lsn.padded()}-{uuid.uuid4().hex[:8]}.json")
    sink.fs.write_text(path, json.dumps(reject, sort_keys=True))
    log.error("undecodable row saved to %s", path)
