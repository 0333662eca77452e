"""Where a batch task's record batches go, and the functions Spark runs as the batch's task.

:mod:`pgpoll.ingest.task` turns a peek into the envelope's Arrow record
batches; this module runs it and writes them:

* :func:`pyarrow_task` (the output is a local path, a ``file:`` URI or an
  object store): the task writes the staged Parquet files itself with
  pyarrow (:mod:`pgpoll.sink.parquet_writer`), and with ``--typed-tables``
  every table's typed rows in the same pass; it runs as a one-partition RDD
  job whose ``collect()`` returns the :class:`~pgpoll.ingest.task.BatchOutcome`.
  :func:`write_batch_here` is the same in this process (a batch in the
  driver). An object store's batch is spilled to a local directory, then
  uploaded to its final keys (:mod:`pgpoll.sink.stores.uploads`);
* :func:`spark_task` (any other store): the function given to
  ``mapInArrow``, yielding the batches to Spark's Parquet writer; the outcome
  travels in a Spark accumulator.

The writes run on their own threads, so Parquet encoding overlaps decoding,
and nothing of a written record batch is kept: the task's memory does not
grow with the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgpoll.errors import PgpollError, SinkError
from pgpoll.ingest.batch_assembler import BatchAssembler
from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
from pgpoll.sink.parquet_writer import (
    ENVELOPE_DICTIONARY,
    ENVELOPE_STATISTICS,
    PYARROW,
    SPARK,
    PartFiles,
    WriterThread,
    clear_directory,
)

if TYPE_CHECKING:
    from pgpoll.sink.typed_tables import TypedTableWriters


def _peak_rss_kb() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _ignore_sigint() -> None:
    """Leave Ctrl-C to the driver: a terminal sends SIGINT to the whole process group, Spark's
    Python workers included, and PySpark's worker turns it into a KeyboardInterrupt traceback.
    The driver cancels the job itself (see :mod:`pgpoll.ingest.stopping`)."""
    import signal

    with contextlib.suppress(ValueError):  # not the worker's main thread: nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def spark_task(spec: BatchSpec, accumulator: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function given to ``mapInArrow``: runs :func:`iter_batch` and reports through ``accumulator``."""

    def run(_input: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _ignore_sigint()
        for _ in _input:
            pass
        outcome = BatchOutcome(writer=SPARK)
        try:
            yield from iter_batch(spec, outcome)
        finally:
            outcome.extra["task_peak_rss_kb"] = _peak_rss_kb()
            accumulator.add({"outcome": outcome})

    return run


def _write_typed(writers: TypedTableWriters, batches: list[pa.RecordBatch]) -> None:
    """The typed rows of a few envelope record batches, combined first (on the typed thread: the copy is work)."""
    for part in pa.Table.from_batches(batches).combine_chunks().to_batches():
        writers.write(part)


def write_batch(spec: BatchSpec, outcome: BatchOutcome, stopped: Callable[[], bool] | None = None) -> None:
    """Run :func:`iter_batch` and write its record batches to ``spec.target`` with pyarrow; fills ``outcome``.

    A local output's batch is written into its staging directory; an object
    store's into a spill directory of this process, then uploaded to its
    final keys under the plan's upload manifest (:mod:`pgpoll.sink.stores.uploads`;
    ``outcome.uploaded`` lists the files). A write error is reported in
    ``outcome.error``; the driver discards the staging (and uploads).
    """
    target = spec.target
    assert target is not None
    if target.upload is None:
        assert target.envelope is not None
        _write_files(spec, outcome, target.envelope, target.tables if spec.typed_tables else None, stopped)
        return
    import shutil

    from pgpoll.sink import layout
    from pgpoll.sink.stores.uploads import new_spill_directory, upload_batch

    spill = new_spill_directory()  # (removes those a killed process left)
    try:
        envelope_dir, tables_dir = f"{spill}/envelope", f"{spill}/tables" if spec.typed_tables else None
        _write_files(spec, outcome, envelope_dir, tables_dir, stopped)
        if outcome.error is None and outcome.changes and outcome.advance_to is not None and target.fs is not None:
            start = outcome.first_commit_lsn if outcome.first_commit_lsn is not None else outcome.advance_to
            try:
                outcome.uploaded = upload_batch(target.fs, target.upload, envelope_dir, tables_dir,
                                                layout.partition_name(start, outcome.advance_to))
            except PgpollError as exc:
                outcome.error = exc
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _write_files(spec: BatchSpec, outcome: BatchOutcome, envelope_dir: str, typed_dir: str | None,
                 stopped: Callable[[], bool] | None) -> None:
    """Write the batch into local directories: the envelope into ``envelope_dir`` as it is produced (one row
    group per record batch, written on a :class:`WriterThread` that overlaps with decoding; at most a few
    batches in memory), each table's typed rows under ``typed_dir`` in the same pass, on a second thread."""
    from pgpoll.sink.typed_tables import TypedTableWriters

    target = spec.target
    assert target is not None
    holder: list[TypedTableWriters] = []

    def ready(asm: BatchAssembler) -> None:
        if typed_dir is not None:
            holder.append(TypedTableWriters(typed_dir, target.ledgers, asm.schemas, target.fs))

    clear_directory(envelope_dir)  # an earlier attempt of this task (the driver clears before each batch)
    if typed_dir is not None:
        clear_directory(typed_dir)
    envelope = PartFiles(envelope_dir, dictionary=ENVELOPE_DICTIONARY, statistics=ENVELOPE_STATISTICS)
    writes = WriterThread()
    typed_writes = WriterThread() if typed_dir is not None else None  # its own thread: both overlap decoding

    pending: list[pa.RecordBatch] = []  # the typed conversion's fixed cost is per call: give it bigger batches

    def typed(final: bool = False) -> None:
        if typed_writes is None or not holder or not pending:
            return
        if final or sum(b.num_rows for b in pending) >= spec.rows_per_arrow_batch:
            taken = list(pending)
            pending.clear()
            typed_writes.submit(lambda: _write_typed(holder[0], taken))

    batches = iter_batch(spec, outcome, on_assembler=ready, stopped=stopped)
    try:
        for batch in batches:
            if batch.num_rows:
                writes.submit(lambda b=batch: envelope.write(b))  # type: ignore[misc]
                if typed_writes is not None:  # (kept only for the typed thread: else the whole batch stayed here)
                    pending.append(batch)
                    typed()
        typed(final=True)
        writes.finish()
        if typed_writes is not None:
            typed_writes.finish()
        envelope.close()
        if holder:
            outcome.typed_files, outcome.ledgers = holder[0].close()
        elif typed_dir is not None:
            outcome.typed_files = {}
    except Exception as exc:  # reported to the driver, which discards the staging
        for thread in (writes, typed_writes):
            if thread is not None:
                with contextlib.suppress(Exception):
                    thread.finish()
        envelope.abort()
        if holder:
            holder[0].abort()
        if outcome.error is None:
            outcome.error = SinkError(
                f"writing the batch failed: {type(exc).__name__}: {exc}", "check that the output is writable"
            )
    finally:
        batches.close()


def write_batch_here(spec: BatchSpec, stopped: Callable[[], bool] | None = None) -> BatchOutcome:
    """:func:`write_batch` in this process (an executor's task, or the driver); the outcome."""
    outcome = BatchOutcome(writer=PYARROW)
    try:
        write_batch(spec, outcome, stopped)
    finally:
        outcome.extra["task_peak_rss_kb"] = _peak_rss_kb()
    return outcome


def pyarrow_task(spec: BatchSpec) -> Callable[[Iterator[Any]], Iterator[BatchOutcome]]:
    """The function of the batch's one-partition RDD job: :func:`write_batch_here`, then yield the outcome."""

    def run(_input: Iterator[Any]) -> Iterator[BatchOutcome]:
        _ignore_sigint()
        for _ in _input:
            pass
        yield write_batch_here(spec)

    return run
