"""The driver's side of a pgpoll stream: offsets, where the next batch ends, and when the slot moves.

An offset is ``{"lsn": "X/Y"}``: the ``lsn`` of a COMMIT row (the end of
the commit record) or of a non-transactional message, as the commit log's
``end`` is, so a batch ``(start, end]`` holds exactly the transactions whose
commit LSN lies in it. (A query's initial offset is the slot's position,
marked ``"initial": true``, and its first batch's end also records that
start as ``"from"``: :func:`batch_range` says why.) Ends never pass the flush
position, and the slot is only ever advanced to one of them. They are found
in one of two ways:

* ``Trigger.AvailableNow`` without ``maxRowsPerTrigger``/``maxBytesPerTrigger``:
  the run is one batch, and its end is *written*, not searched for.
  :meth:`StreamOffsets.prepare_available_now` writes a non-transactional
  ``pgpoll.heartbeat`` message (when the slot has WAL after its position) and
  takes its LSN once it is flushed
  (:func:`pgpoll.source.commit_boundaries.mark_boundary` says why that LSN is
  a boundary); ``latestOffset`` then returns it without a decode. Anything in
  the WAL after the slot, even what no peek returns, gets the run that one
  batch (empty then): telling them apart would cost the decode avoided.
* Otherwise (a limit, or another trigger) by the server
  (:func:`pgpoll.source.commit_boundaries.next_boundary`, a decode on the
  driver that ships one row), capped for ``Trigger.AvailableNow`` at the flush
  position when the run started.

When Spark calls what, and why the slot may move then (Spark 4.3's
``MicroBatchExecution``, ``org.apache.spark.sql.execution.streaming.runtime``):

* ``constructNextBatch`` asks ``latestOffset(start, limit)`` only when no
  batch is constructed and pending, i.e. after ``markMicroBatchEnd`` wrote
  ``commits/N`` for the batch that ended at ``start`` (the sink has it), or
  at a restart where ``populateStartOffsets`` found the newest ``offsets/N``
  already in ``commits/`` (then ``start`` is that batch's end), or for the
  very first batch (``start`` is :meth:`StreamOffsets.initial`). So the
  changes up to ``start`` are in the sink: :meth:`StreamOffsets.latest`
  advances the slot to ``start`` before it looks for the next end. That
  keeps an idle stream from pinning WAL, and makes the next peeks decode only
  what is new.
* Then ``markMicroBatchStart`` writes ``offsets/N+1`` and
  ``cleanUpLastExecutedMicroBatch`` calls ``commit(end of N)``: a no-op by
  then, kept for sources of truth other than this order.
* A restart re-runs a batch from its logged ``(start, end)`` without asking
  ``latestOffset``; the batch's task then peeks from wherever the slot is
  (at or before ``start``) and keeps only its own transactions.
* ``Trigger.AvailableNow`` calls ``prepareForTriggerAvailableNow`` once
  (``MicroBatchExecution.logicalPlan``, ``MultiBatchExecutor``) and stops the
  query when ``latestOffset`` returns its ``start``; so the last call of a
  run advances the slot to the run's last batch end.

Async progress tracking (``asyncProgressTrackingEnabled``) breaks the first
point (offsets and commits are written behind the batches): not supported.

If the slot is already past ``start`` (a lost or restored checkpoint,
another consumer, an administrator's advance), the changes between are gone
from the slot: :class:`~pgpoll.errors.SlotMovedError`, never a silent skip.

Every call that can wait on the server is watched (:mod:`pgpoll.source.waits`),
as ingest's are: the driver's peek for the next batch's end, the advance (the
control connection's), and each task's peek (the ingest task's). A failover
slot's peek waiting on ``synchronized_standby_slots`` for a standby slot that
is missing, invalidated or inactive is reported, then cancelled: the query
fails with :class:`~pgpoll.errors.StandbyWaitError` naming the setting,
instead of hanging with nothing said.

Heartbeats: with pgoutput on PostgreSQL 15+ a transaction that touches no
published table produces no row, so a slot whose database writes only other
tables would never reach a boundary and would pin WAL. When the slot lags
:data:`HEARTBEAT_AFTER_BYTES` behind the WAL with nothing to read, a
transactional ``pgpoll.heartbeat`` message is written (as ``pgpoll ingest``
does): its COMMIT is the next boundary, and the batch holds no row of it.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from pgpoll.errors import ConfigError, PgpollError, PublicationNotFoundError, SlotMovedError, WrongPluginError
from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.commit_boundaries import Boundary, flush_position, mark_boundary, next_boundary, wait_flushed
from pgpoll.source.connection import resolve_dsn
from pgpoll.source.control import ControlConnection
from pgpoll.source.names import check_identifier, check_slot_name
from pgpoll.source.waits import CallWatch
from pgpoll.spark.source_options import SourceOptions

__all__ = ["HEARTBEAT_AFTER_BYTES", "StreamOffsets", "batch_range", "check_slot_not_past", "next_offset", "offset_json",
           "offset_lsn"]

log = logging.getLogger("pgpoll.spark")

HEARTBEAT_AFTER_BYTES = 16 << 20
"""WAL (bytes) a slot may lag with nothing to read before a heartbeat is written (one WAL segment)."""
HEARTBEAT_EVERY_S = 60.0
"""At most one heartbeat a minute from a running stream."""


def offset_json(lsn: Lsn, *, initial: bool = False, first_from: Lsn | None = None) -> dict[str, Any]:
    """A stream offset: the boundary as PostgreSQL prints it (see :func:`batch_range` for the other keys)."""
    offset: dict[str, Any] = {"lsn": str(lsn)}
    if initial:
        offset["initial"] = True
    if first_from is not None:
        offset["from"] = str(first_from)
    return offset


def offset_lsn(offset: Mapping[str, Any]) -> Lsn:
    """The boundary of a stream offset; :class:`ConfigError` for one pgpoll did not write."""
    text = offset.get("lsn") if isinstance(offset, Mapping) else None
    if not isinstance(text, str):
        raise ConfigError(f"offset {offset!r} is not a pgpoll offset", "start the query with a new checkpoint location")
    return Lsn.parse(text)


def next_offset(start: Mapping[str, Any], end: Lsn) -> dict[str, Any]:
    """What ``latestOffset`` returns: ``start`` itself when nothing is new, else ``end`` (see :func:`batch_range`)."""
    if end == offset_lsn(start):
        return dict(start)
    return offset_json(end, first_from=offset_lsn(start) if start.get("initial") else None)


def batch_range(start: Mapping[str, Any], end: Mapping[str, Any]) -> tuple[Lsn, Lsn]:
    """The boundaries ``(after, upto]`` of the batch Spark planned from ``start`` to ``end``.

    Spark logs each batch's *end* offset only (``offsets/N``); a batch's start
    is the previous batch's end, except for a query's first batch, whose start
    Spark asks ``initialOffset`` for again when it re-runs the batch after a
    restart. The slot's position then may have moved on (another consumer),
    and a start taken from it would hide that. So the initial offset is marked
    (``"initial": true``) and the first batch's end records its start
    (``"from"``), which this function prefers: the re-run batch checks the
    slot against the start it was planned with.
    """
    after = end.get("from")
    return (Lsn.parse(after) if isinstance(after, str) else offset_lsn(start)), offset_lsn(end)


def check_slot_not_past(info: slot_access.SlotInfo, start: Lsn) -> None:
    """Refuse to read a batch starting at ``start`` when the slot was advanced past it."""
    confirmed = info.confirmed_flush_lsn
    if confirmed is not None and confirmed > start:
        raise SlotMovedError(
            f'replication slot "{info.name}" is at {confirmed}, past {start} where this query\'s next batch starts: '
            "the changes in between were consumed by someone else (another query or pgpoll ingest on the slot, an "
            "advance by hand) or the query restarted from a lost or older checkpoint",
            "give each query its own slot and keep its checkpoint; to go on from the slot's position (the changes "
            "in between are gone from it), start the query with a new checkpoint location",
            lsn=str(start),
        )


class StreamOffsets:
    """One stream's offsets on the driver, over one control connection (opened on first use, never in a task)."""

    def __init__(self, opts: SourceOptions) -> None:
        assert opts.slot is not None
        self.opts = opts
        self.slot = check_slot_name(opts.slot)
        self._control: ControlConnection | None = None
        self._plugin: str | None = None
        self._peek_options: list[str] = []
        self._initial: Lsn | None = None
        self.cap: Lsn | None = None  # Trigger.AvailableNow: nothing committed after this WAL position is read
        self.cap_is_boundary = False  # ... and it is a boundary: the run's end, found without a decode
        self.decodes = 0  # decodes on the driver to find a batch's end (for tests and logs)
        self._run_id = f"spark-{uuid.uuid4().hex[:12]}"
        self._last_heartbeat = 0.0
        self.last: Boundary | None = None  # the last latestOffset's finding (for tests and logs)

    # ---- connection and the slot's checks -----------------------------------------------------------

    @property
    def control(self) -> ControlConnection:
        """The control connection, checked on first use (slot, plugin, publications)."""
        if self._control is None:
            control = ControlConnection(resolve_dsn(self.opts.dsn or None), self.slot)
            control.open()
            try:
                self._preflight(control)
            except BaseException:
                control.close()
                raise
            self._control = control
        return self._control

    def _preflight(self, control: ControlConnection) -> None:
        info = slot_access.check_usable(control.slot_info())
        plugin = slot_access.check_plugin(info, self.opts.plugin)
        if info.two_phase:
            raise WrongPluginError(f'slot "{self.slot}" decodes prepared transactions (two_phase)',
                                   "create the slot without --two-phase for a pgpoll stream")
        if plugin == "pgoutput":
            from pgpoll.source.publications import publication_exists

            if not self.opts.publications:
                raise ConfigError(f'slot "{self.slot}" uses pgoutput, which needs a publication',
                                  '.option("publication", NAME) (comma list for several)')
            for pub in self.opts.publications:
                check_identifier(pub, "publication name")
                if not control.call(functools.partial(publication_exists, name=pub)):
                    raise PublicationNotFoundError(f'publication "{pub}" does not exist',
                                                   "create it: pgpoll publication create NAME --table schema.tbl")
        self._plugin = plugin
        self._peek_options = slot_access.peek_options(plugin, publications=list(self.opts.publications))

    @property
    def plugin(self) -> str:
        """The slot's plugin (``auto`` resolved)."""
        _ = self.control
        assert self._plugin is not None
        return self._plugin

    @property
    def peek_options(self) -> list[str]:
        """The plugin options every peek of this stream passes (the tasks' too)."""
        _ = self.control
        return list(self._peek_options)

    # ---- what Spark asks ----------------------------------------------------------------------------

    def initial(self) -> Lsn:
        """Where a new query starts: the slot's position when it was first asked (kept for the run)."""
        if self._initial is None:
            info = self.control.slot_info()
            position = info.confirmed_flush_lsn or info.restart_lsn
            if position is None:
                raise ConfigError(f'replication slot "{self.slot}" has no position yet', "try again in a moment")
            self._initial = Lsn(position)
        return self._initial

    def prepare_available_now(self) -> None:
        """Fix the run's target (after a heartbeat, when the slot lags).

        Without admission limits the target is a boundary written now
        (:meth:`_mark_run_end`), and the run is one batch found without a
        decode. With a limit each batch's end takes a decode on the driver
        anyway, and the target only caps them: what is flushed now.
        """
        self._heartbeat_if_lagging(rate_limited=False)
        self.cap, self.cap_is_boundary = None, False
        if self.opts.max_rows is None and self.opts.max_bytes is None:
            self.cap = self._mark_run_end()
            self.cap_is_boundary = self.cap is not None
        if self.cap is None:
            self.cap = self.control.call(flush_position)
        log.info("Trigger.AvailableNow: reading slot %s up to %s%s", self.slot, self.cap,
                 " (a boundary: no decode on the driver)" if self.cap_is_boundary else "")

    def _mark_run_end(self) -> Lsn | None:
        """The run's last boundary without a decode: the slot's position when nothing was written after it,
        else a non-transactional heartbeat written now (:func:`~pgpoll.source.commit_boundaries.mark_boundary`
        says why its LSN is a boundary), once flushed. ``None`` where no message can be written (a standby, a
        read-only role): the run then finds its end by a decode.

        Anything in the WAL after the slot's position, even what no peek returns (writes to unpublished tables,
        the server's own records), gets the run a batch, empty then; telling those apart would take the decode
        this avoids.
        """
        control = self.control
        info = slot_access.check_usable(control.slot_info())
        position = info.confirmed_flush_lsn or info.restart_lsn
        if position is not None and control.call(flush_position) <= position:
            return Lsn(position)  # nothing after the slot: no batch
        if control.on_standby():  # nothing can be written there (the how-to "Capture from a standby")
            return None
        try:
            end = control.call(functools.partial(mark_boundary, content=json.dumps({"run": self._run_id, "end": True})))
        except PgpollError as exc:
            log.warning("slot %s: no boundary could be written (%s); the run's end is found by a decode",
                        self.slot, exc.message)
            return None
        control.call(functools.partial(wait_flushed, lsn=end))  # a SourceError when the WAL writer never flushes it
        return end

    def latest(self, start: Lsn, max_changes: int | None, max_bytes: int | None) -> Lsn:
        """The next batch's end after ``start`` (``start`` itself: nothing new); the slot is moved to ``start`` first.

        See the module docstring for why ``start`` is durable in the sink here.
        """
        control = self.control
        info = slot_access.check_usable(control.slot_info())
        check_slot_not_past(info, start)
        if info.confirmed_flush_lsn is None or info.confirmed_flush_lsn < start:
            control.advance(start)
        if self.cap is not None and self.cap_is_boundary and max_changes is None and max_bytes is None:
            self.last = None  # no decode: the run's end is its one batch's end
            return self.cap if start < self.cap else start
        watch = CallWatch(control.target, f'the peek of slot "{self.slot}" for the next batch\'s end')
        found = control.call(lambda c: next_boundary(
            c, self.slot, self.plugin, self._peek_options, after=start, cap=self.cap,
            max_changes=max_changes, max_bytes=max_bytes, watch=watch))
        self.decodes += 1
        self.last = found
        if found.end is None:
            if self.cap is None:
                self._heartbeat_if_lagging(rate_limited=True)
            return start
        log.debug("next batch of slot %s: (%s, %s], %d change(s), %d byte(s)%s", self.slot, start, found.end,
                  found.changes, found.bytes, " (one transaction over the limit)" if found.over_limit else "")
        return found.end

    def commit(self, end: Lsn) -> None:
        """Spark has the batch ending at ``end`` in its sink: the slot may move there (idempotent)."""
        self.control.advance(end)

    def stop(self) -> None:
        """Close the control connection."""
        if self._control is not None:
            self._control.close()
            self._control = None

    # ---- heartbeats ---------------------------------------------------------------------------------

    def _heartbeat_if_lagging(self, *, rate_limited: bool) -> None:
        """Write a heartbeat when the slot lags far with nothing to read (see the module docstring).

        ``rate_limited``: at most one per :data:`HEARTBEAT_EVERY_S` (a running
        stream asks at every trigger; its heartbeat's batch comes a trigger later).
        """
        if rate_limited and time.monotonic() - self._last_heartbeat < HEARTBEAT_EVERY_S:
            return
        lag = self.control.wal_lag()
        if lag is None or lag < HEARTBEAT_AFTER_BYTES:
            return
        try:
            self.control.emit_heartbeat(self._run_id)
            self._last_heartbeat = time.monotonic()
        except PgpollError as exc:  # a read-only role: the WAL stays pinned until captured tables change
            log.warning("slot %s lags %d bytes and no heartbeat could be written: %s", self.slot, lag, exc.message)

