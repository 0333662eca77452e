"""A Spark task's read of a slot: one stream batch ``(start, end]``, or a preview of what is pending.

Runs on an executor with a connection of its own, through the ingest task's
decode path (:func:`pgpoll.ingest.task.iter_batch`: the ADBC or psycopg2
peek, the column-wise Insert decoders, the batch assembler), so a stream and
``pgpoll ingest`` write the same rows, column for column: heartbeats dropped,
logical messages and TRUNCATE as in the change log, ``tables`` applied the
same way. Nothing here moves the slot.

A stream batch peeks with ``upto_lsn = end`` (the server stops after the
commit record that ends there) and with ``end``'s predecessor ``start`` as
the high-water mark: transactions committed at or before ``start`` (the slot
may trail it: a restart re-runs a batch) are dropped. Three checks keep a
batch exact rather than silently short:

* before the peek and after it, the slot must not be past ``start``
  (:func:`pgpoll.spark.stream_offsets.check_slot_not_past`): nobody else took
  changes of this batch;
* the peek must reach ``end`` exactly (the assembler's last boundary): a
  batch that stops early would lose the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.errors import DecodeError, SourceError
from pgpoll.lsn import Lsn
from pgpoll.table_patterns import TablePatterns
from pgpoll.typed.schemas import TableSchema

__all__ = ["SlotRead", "read_slot"]


@dataclass(frozen=True)
class SlotRead:
    """What a task needs to read a slot (pickled to the executor); ``dsn`` never shows in a repr."""

    dsn: str = field(repr=False)
    slot: str
    plugin: str
    options: tuple[str, ...]
    start: int | None = None  # a stream batch: after this boundary (None: a preview, everything pending)
    end: int | None = None  # ... and up to this one
    tables: TablePatterns = field(default_factory=TablePatterns)
    fetch: str = "auto"

    def __repr__(self) -> str:
        what = f"({Lsn(self.start)}, {Lsn(self.end)}]" if self.start is not None and self.end is not None else "pending"
        return f"SlotRead(slot={self.slot!r}, plugin={self.plugin!r}, {what})"


def _upto(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    """Rows committed at or before ``end`` (all of them, unless the peek went further than asked)."""
    last = batch.column(0)[batch.num_rows - 1].as_py()
    if last is None or last <= end:
        return batch
    return batch.filter(pc.less_equal(batch.column(0), pa.scalar(end, pa.int64())))


def _check_slot(conn: Any, read: SlotRead) -> None:
    from pgpoll.source.slots import check_usable, get_slot
    from pgpoll.spark.stream_offsets import check_slot_not_past

    assert read.start is not None
    check_slot_not_past(check_usable(get_slot(conn, read.slot)), Lsn(read.start))


def read_slot(read: SlotRead, on_schemas: Callable[[Mapping[str, TableSchema]], None] | None = None) -> Iterator[pa.RecordBatch]:
    """The change-log record batches of ``read`` (the envelope's schema), checked as the module docstring says.

    ``on_schemas`` gets the batch assembler's registry of table shapes (schema
    id -> :class:`~pgpoll.typed.schemas.TableSchema`), which grows as rows are decoded.
    """
    from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
    from pgpoll.source.connection import ConnectionTarget, connect

    stream = read.start is not None and read.end is not None
    conn = connect(ConnectionTarget(read.dsn, "task"), application_name=f"pgpoll spark {read.slot}") if stream else None
    try:
        if conn is not None:
            _check_slot(conn, read)
        spec = BatchSpec(
            dsn=read.dsn, slot=read.slot, plugin=read.plugin, options=read.options, upto_nchanges=None,
            high_water_mark=read.start, tables=read.tables, fetch=read.fetch, upto_lsn=read.end,
        )
        outcome = BatchOutcome()
        batches = iter_batch(spec, outcome, on_assembler=None if on_schemas is None else lambda asm: on_schemas(asm.schemas))
        try:
            for batch in batches:
                if read.end is not None and batch.num_rows:
                    batch = _upto(batch, read.end)
                if batch.num_rows:
                    yield batch
        finally:
            batches.close()
        if outcome.error is not None:
            if outcome.reject is not None and isinstance(outcome.error, DecodeError):
                outcome.error.lsn = outcome.error.lsn or outcome.reject.get("lsn")
            raise outcome.error
        if conn is not None:
            _check_slot(conn, read)
            if outcome.advance_to != read.end:
                reached = str(Lsn(outcome.advance_to)) if outcome.advance_to is not None else "no boundary"
                raise SourceError(
                    f'the batch ({Lsn(read.start or 0)}, {Lsn(read.end or 0)}] of slot "{read.slot}" ended at {reached}: '
                    "the slot no longer returns the transaction the batch ends with",
                    "check the slot (pgpoll status); if it was recreated or advanced, start the query with a new "
                    "checkpoint location",
                    lsn=str(Lsn(read.end or 0)),
                )
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
