"""A batch's range decoded in parts at once: the slot up to the first split, temporary copies after it.

Why: the server builds a peek's whole result before its first row leaves,
and the slot can be peeked by one backend at a time, so on one slot the
server decodes while the client waits and then the client decodes while the
server idles. With ``--decode-parallelism N`` (:data:`PARALLELISM_ENV`) a
large batch's WAL range is cut at N-1 LSNs chosen when the batch is planned
(:func:`split_points`: never a ``--batch-changes`` boundary, which is known
only once a peek ends). The task peeks the durable slot up to the first split
as before, and at the same time one temporary copy of the slot per later part
decodes that part (:mod:`pgpoll.source.slot_copies`, which quotes the
PostgreSQL source that makes the cut exact); the client decodes the first part
while the server still builds the next, and reads the parts in order.

Nothing else changes: the batch is still one plan, one staged output, one
commit-log record, one advance of the durable slot to the batch's last COMMIT,
in order — a kill loses only the copies' sessions (the server drops a
temporary slot when its session ends) and nothing a recovery must know.

Where two parts meet, the part before may hold one transaction more than its
split (the commit record after an alignment gap holding the split): before a
copy's part is read the assembler's high-water mark is raised to the last
COMMIT (or non-transactional message) LSN read so far, so that transaction,
come again as the copy's first, is dropped as one the output holds already.
A part must end outside a transaction (a peek returns whole transactions):
anything else is an error, not a guess. A copy that cannot be made (no free
slot, no permission, a split the server cannot place) falls back, before any
of its rows is read: the rest of the batch is peeked from the durable slot,
the parts already read dropped by the same high-water mark.

Cost on the server: each copy holds one of ``max_replication_slots`` (the
driver uses only free ones), pins the slot's ``catalog_xmin`` and WAL for its
transaction, and reads WAL from the slot's ``restart_lsn`` to its split twice
(the advance, fast-forward, and its peek, which queues and forgets the
transactions before the split); the durable slot's advance after the commit
reads the whole batch again, as it always did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from pgpoll.errors import ConfigError, SourceError
from pgpoll.ingest.peek_chunks import Chunk, _arrow_chunks, tagged_items
from pgpoll.lsn import Lsn
from pgpoll.source.arrow_peek import PSYCOPG2
from pgpoll.source.connection import ConnectionTarget
from pgpoll.source.slot_copies import CopyUnavailableError, free_slots, peek_copy, usable_slots

if TYPE_CHECKING:
    from pgpoll.ingest.batch_assembler import BatchAssembler
    from pgpoll.source.control import ControlConnection

log = logging.getLogger("pgpoll.ingest")

PARALLELISM_ENV = "PGPOLL_DECODE_PARALLELISM"
DECODE_PARALLELISM = 2
"""The default of ``--decode-parallelism``: the slot and one copy. Measured on the 2-core machine this was built
on (docs/performance.md, three runs, medians of 5 on the idle machine): 1M changes in 10,000-row transactions
drained in 1.17-1.33x the server's decode for test_decoding against 1.38-1.58x with the slot alone, and in
1.53x and 1.68x for pgoutput against 1.85x and 2.25x (the third: 2.12x against 2.07x); one huge transaction,
which cannot be cut, within the noise (1.23-1.35x against 1.29-1.42x). Three parts were not steadily better: two cores, and the
client's decode and Parquet encoding already use most of one."""

PARALLEL_MIN_WAL = 32 << 20
"""A batch's range below this many bytes of WAL is decoded by the slot alone: a copy's set-up is not worth it."""

MIN_WAL_ENV = "PGPOLL_DECODE_MIN_WAL"
"""Overrides :data:`PARALLEL_MIN_WAL` (bytes; the tests cut small backlogs with it)."""

FIRST_SHARE = 0.8
"""The first part's share of an even cut: smaller, so the client starts decoding sooner (measured, see the docs)."""

LANE_DEPTH = 8
"""Record batches (about 4 MB each) a copy's reader holds ahead; the rest waits on the server, already decoded.

More than the slot's own reader (2): ADBC parses a copy's rows outside the GIL, on the core the copy's
server process has just left, while the client still decodes the part before."""


class BatchSpec(Protocol):
    """What this module reads of a batch's :class:`pgpoll.ingest.task.BatchSpec` (which imports this module)."""

    @property
    def dsn(self) -> str: ...
    @property
    def slot(self) -> str: ...
    @property
    def plugin(self) -> str: ...
    @property
    def options(self) -> tuple[str, ...]: ...
    @property
    def upto_lsn(self) -> int | None: ...
    @property
    def upto_nchanges(self) -> int | None: ...
    @property
    def high_water_mark(self) -> int | None: ...
    @property
    def fetch(self) -> str: ...
    @property
    def batch_number(self) -> int: ...
    @property
    def decode_parallelism(self) -> int: ...
    @property
    def splits(self) -> tuple[int, ...]: ...


def split_points(start: int, end: int, parts: int) -> tuple[int, ...]:
    """The ``parts - 1`` LSNs cutting ``start..end``: the first part :data:`FIRST_SHARE` of an even one."""
    if parts < 2 or end <= start:
        return ()
    span = end - start
    first = int(span * FIRST_SHARE / parts)
    rest = (span - first) / (parts - 1)
    return tuple(start + first + int(rest * i) for i in range(parts - 1))


def _min_wal() -> int:
    raw = os.environ.get(MIN_WAL_ENV, "").strip()
    if not raw.isdigit():
        if raw:
            raise ConfigError(f"{MIN_WAL_ENV}={raw!r} is not a number of bytes", f"set {MIN_WAL_ENV} to a whole number")
        return PARALLEL_MIN_WAL
    return max(1, int(raw))


def decode_splits(control: ControlConnection, spec: BatchSpec) -> tuple[int, ...]:
    """Where the batch ``spec`` is cut (empty: the slot alone decodes it), with a log line saying why not.

    Decided on the driver just before the batch, from the slot as it is then:
    the batch's range starts at the slot's position (or the high-water mark)
    and ends at ``spec.upto_lsn`` or the end of WAL. No cut under a row limit
    (``--batch-changes``, ``--max-changes``: the peek may end before a split),
    under :data:`PARALLEL_MIN_WAL`, with psycopg2 fetching (copies are read
    through ADBC), on a failover slot (a copy does not wait for
    ``synchronized_standby_slots``: it could hand out changes a standby has
    not received), or without a free replication slot.
    """
    if spec.decode_parallelism < 2 or spec.upto_nchanges is not None:
        return ()
    slot = control.slot_info()
    confirmed = int(slot.confirmed_flush_lsn) if slot.confirmed_flush_lsn is not None else 0
    start = max(confirmed, spec.high_water_mark or 0)
    end = spec.upto_lsn if spec.upto_lsn is not None else confirmed + slot.lag_bytes if slot.lag_bytes else start
    if end - start < _min_wal():
        return ()
    why = None
    if spec.fetch == PSYCOPG2:
        why = "PGPOLL_FETCH=psycopg2 (copies are read through ADBC)"
    elif slot.failover:
        why = "it is a failover slot (a copy does not wait for synchronized_standby_slots)"
    else:
        free = control.call(free_slots)
        copies = min(spec.decode_parallelism - 1, usable_slots(free))
        if copies >= 1:
            log.info('batch %d of slot "%s": %s of WAL in %d parts decoded at once, %d by temporary copies',
                     spec.batch_number, spec.slot, _size(end - start), copies + 1, copies)
            return split_points(start, end, copies + 1)
        why = "max_replication_slots has no free slot for a temporary copy (one is always left for others)"
    log.info('batch %d of slot "%s" is decoded by the slot alone: %s', spec.batch_number, spec.slot, why)
    return ()


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class _Lane:
    """One copy's part, decoded from the moment the batch starts, handed over in order (a thread, a queue)."""

    def __init__(self, spec: BatchSpec, start: int, upto: int | None) -> None:
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=LANE_DEPTH)
        self.stop = threading.Event()
        self.reference: int | None = None
        self._cancel: Callable[[], None] | None = None
        self.thread = threading.Thread(target=self._run, args=(spec, start, upto), name="pgpoll-copy-peek", daemon=True)
        self.thread.start()

    def _set_reference(self, value: int) -> None:
        self.reference = value

    def _set_cancel(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel

    def _put(self, entry: tuple[str, Any]) -> bool:
        while not self.stop.is_set():
            try:
                self.items.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, spec: BatchSpec, start: int, upto: int | None) -> None:
        batches = peek_copy(
            ConnectionTarget(spec.dsn, "task"), spec.slot, spec.plugin, start=Lsn(start),
            upto_lsn=Lsn(upto) if upto is not None else None, options=list(spec.options),
            application_name=f"pgpoll ingest {spec.slot} copy", on_xid_reference=self._set_reference,
            on_cancel=self._set_cancel,
        )
        try:
            for chunk in _arrow_chunks(batches):
                if not self._put(("item", chunk)):
                    return
            self._put(("done", None))
        except BaseException as exc:  # handed to the reader, in order
            self._put(("error", exc))
        finally:
            batches.close()  # stopped early: the copy's connection is closed (and the copy with its session)

    def chunks(self) -> Iterator[Chunk]:
        return tagged_items(self.items)

    def close(self) -> None:
        """Stop the part: a statement still running on the server is cancelled (an error there drops the copy)."""
        self.stop.set()
        if self.thread.is_alive() and self._cancel is not None:
            with contextlib.suppress(Exception):
                self._cancel()
        self.thread.join(timeout=30)


def _joined(asm: BatchAssembler, split: int) -> None:
    """Between two parts: the one before ended outside a transaction; its last commit becomes the mark."""
    if asm.in_transaction:
        raise SourceError(f"the peek up to {Lsn(split)} ended inside a transaction",
                          "run again with --decode-parallelism 1, and report it")
    if asm.advance_to is not None:
        asm.hwm = asm.advance_to if asm.hwm is None else max(asm.hwm, asm.advance_to)


def ranged_chunks(peek: Callable[[int | None], Iterator[Chunk]], spec: BatchSpec, asm: BatchAssembler) -> Iterator[Chunk]:
    """The batch's chunks, part after part: ``peek(upto_lsn)`` reads the durable slot, copies the rest.

    The copies start decoding at once, before the slot's own part is read.
    """
    splits = spec.splits
    ends = [*splits[1:], spec.upto_lsn]
    lanes: list[_Lane] = []
    try:
        lanes = [_Lane(spec, split, end) for split, end in zip(splits, ends, strict=True)]
        yield from peek(splits[0])
        for split, lane in zip(splits, lanes, strict=True):
            _joined(asm, split)
            try:
                for chunk in lane.chunks():
                    if asm.xid_reference is None and lane.reference is not None:
                        asm.set_xid_reference(lane.reference)
                    yield chunk
            except CopyUnavailableError as exc:  # nothing of this part was read: the slot reads the rest
                log.info('a temporary copy of slot "%s" could not be used (%s): the slot itself reads the rest '
                         "of batch %d", spec.slot, exc, spec.batch_number)
                yield from peek(spec.upto_lsn)
                return
    finally:
        for lane in lanes:
            lane.close()
