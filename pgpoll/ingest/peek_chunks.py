"""The batch task's peek, a fetch at a time, in one shape whichever driver fetched it.

Two ways in (:func:`pgpoll.source.arrow_peek.choose_fetch`): ADBC's Arrow
record batches (where adbc-driver-postgresql is installed) or psycopg2's
lists of rows. Either becomes a :class:`Chunk`: the rows' LSNs and
transaction ids as Python lists, each row's ``data`` on demand, and the
:class:`~pgpoll.decode.pgoutput_columns.PeekChunk` that the column-wise
Insert paths read. The decoding loop (:mod:`pgpoll.ingest.task`)
does not know which driver fetched.

The transaction-id reference (see :func:`pgpoll.source.slots.peek_rows`) is
read after the server built the peek's result: psycopg2 reads it inside the
peek's transaction; with ADBC the peek's connection is busy streaming COPY,
so it is read on the task's psycopg2 connection once the first batch has
arrived — any snapshot taken after the result was built serves, the ids are
the server's.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pgpoll.decode.pgoutput_columns import PeekChunk

if TYPE_CHECKING:
    from pgpoll.source.waits import CallWatch

__all__ = ["Chunk", "peek_chunks", "prefetched"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive rows of a peek.

    ``lsns`` is a NumPy array: a run decoded column-wise hands its slice to
    Arrow without a copy, and no Python int is made per row (a list of a
    million LSNs and transaction ids cost about 0.1 s to make and to turn back
    into Arrow). The row path asks for one row's LSN and transaction id at a time.
    """

    lsns: npt.NDArray[np.int64]
    xid_of: Callable[[int], int | None]  # row number -> its transaction id
    value: Callable[[int], Any]  # row number -> its data (bytes or a buffer)
    columns: PeekChunk | None  # the data laid out for the column-wise paths (None: not laid out)

    def __len__(self) -> int:
        return len(self.lsns)


def _arrow_chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[Chunk]:
    for batch in batches:
        if batch.num_rows:
            columns = PeekChunk.of_arrow(batch.column(2))
            lsns = batch.column(0).to_numpy()  # never null: no copy
            xids = batch.column(1).to_numpy()
            yield Chunk(lsns, lambda row, x=xids: int(x[row]), columns.value, columns)  # type: ignore[misc]


def prefetched(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, produced on a background thread at most ``depth`` ahead: the fetch overlaps the decoding.

    ADBC reads and parses the COPY stream outside the GIL, so the next
    batch arrives while this one is decoded. An error of ``items`` is raised
    here, in order; when the caller stops early the producer stops at its
    next item and closes ``items`` on its own thread (a generator's clean-up,
    such as rolling back the peek's transaction, runs where it ran).
    """
    slots: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(("item", item)):
                    break
            else:
                put(("done", None))
        except BaseException as exc:  # handed to the consumer
            put(("error", exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="pgpoll-peek-fetch", daemon=True)
    thread.start()
    try:
        yield from tagged_items(slots)
    finally:
        stop.set()
        thread.join(timeout=60)


def peek_chunks(
    conn: Any,
    dsn: str,
    slot: str,
    plugin: str,
    *,
    fetch: str,
    upto_lsn: int | None = None,
    upto_nchanges: int | None,
    options: list[str],
    rows_per_fetch: int,
    on_xid_reference: Callable[[int], None],
    on_fallback: Callable[[str], None] | None = None,
    watch: CallWatch | None = None,
) -> Iterator[Chunk]:
    """The peek of ``slot`` as :class:`Chunk` s; ``fetch`` is ``"adbc"`` or ``"psycopg2"`` (already chosen).

    An ADBC peek that fails before its first row is read again with psycopg2
    (:class:`~pgpoll.source.arrow_peek.FetchUnavailableError`); ``on_fallback``
    hears why. ``upto_lsn`` (a batch's WAL budget, a Spark stream's batch end)
    stops the decoding after the WAL record that ends there. ``watch`` says
    when the server's decoding waits (:mod:`pgpoll.source.waits`).
    """
    from pgpoll.lsn import Lsn
    from pgpoll.source.arrow_peek import ADBC, FetchUnavailableError, peek_arrow
    from pgpoll.source.connection import ConnectionTarget
    from pgpoll.source.slots import peek_chunks as psycopg2_chunks
    from pgpoll.source.slots import xid_reference

    upto = Lsn(upto_lsn) if upto_lsn is not None else None
    if fetch == ADBC:
        batches = peek_arrow(
            ConnectionTarget(dsn, "task"), slot, plugin, upto_lsn=upto, upto_nchanges=upto_nchanges, options=options,
            application_name=f"pgpoll ingest {slot}", on_first_batch=lambda: on_xid_reference(xid_reference(conn)),
            watch=watch,
        )
        try:
            yield from prefetched(_arrow_chunks(batches))
            return
        except FetchUnavailableError as exc:  # nothing read yet: psycopg2 reads the peek, or raises the server's error
            if on_fallback is not None:
                on_fallback(str(exc))
    for rows in psycopg2_chunks(
        conn, slot, plugin, upto_lsn=upto, upto_nchanges=upto_nchanges, options=options, raw_text=True,
        itersize=rows_per_fetch,
        on_xid_reference=on_xid_reference, watch=watch,
    ):
        datas = [row[2] for row in rows]
        xids = [row[1] for row in rows]
        yield Chunk(np.fromiter((row[0] for row in rows), np.int64, len(rows)), xids.__getitem__, datas.__getitem__,
                    PeekChunk.of_values(datas))


def tagged_items(entries: queue.Queue[tuple[str, Any]]) -> Iterator[Any]:
    """A producer thread's entries, in order: ``("item", x)`` yields x, ``("error", exc)`` raises it in the
    consumer, ``("done", None)`` ends (the fetch-ahead above and a copy's part in :mod:`pgpoll.ingest.decode_ranges`)."""
    while True:
        kind, value = entries.get()
        if kind == "item":
            yield value
        elif kind == "error":
            raise value
        else:
            return
