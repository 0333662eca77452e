"""The ingest driver's control connection: slot reads, heartbeat and advance, with reconnect-on-loss.

It holds no lock and no session state (issue 17): a session advisory lock
protects nothing behind a transaction pooler and stays behind on a pooled
server connection, where it blocks whoever lands there next. What keeps two
runs apart is the output's fenced commit log (and, for a fast "busy"
answer, a lease file in the output); on the server every call is one
transaction with the pinned settings (:mod:`pgpoll.source.session`).

Retries: a connection that fails at *start* fails at once (nothing
listening, a name that does not resolve, a refused login: a retry would only
delay the same answer), except while the server says it is starting up or
has no free connection slot. A connection lost *mid-run* (server restart,
terminated backend) is re-opened with bounded exponential backoff. Every
retry is logged on the ``pgpoll`` logger: attempt, reason, next wait.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg2
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from pgpoll.changes import HEARTBEAT_PREFIX
from pgpoll.errors import PgpollError
from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.server_errors import is_transient, translate
from pgpoll.source.server_state import in_recovery
from pgpoll.source.session import pinned_transaction
from pgpoll.source.waits import CallWatch, backend_pid

log = logging.getLogger("pgpoll")
T = TypeVar("T")

# Connection failures worth a retry even at start: the server is starting up,
# shutting down or in recovery (57P03), or has no free connection slot (53300).
START_RETRY_SQLSTATES = frozenset({"57P03", "53300"})


_FLUSH_ARG_SINCE = 170000  # pg_logical_emit_message(..., flush => true): PostgreSQL 17+


def write_heartbeat(
    conn: Any, content: str, *, transactional: bool, slot: str | None = None, watch: CallWatch | None = None,
) -> Lsn:
    """Write a ``pgpoll.heartbeat`` message with ``content`` in its own transaction; returns its LSN.

    Transactional (the ingest's heartbeat): committed synchronously, so it
    is durable and decodable when this returns, and a peek returns it with its
    transaction. Not transactional (a Spark run's end, see
    :func:`pgpoll.source.commit_boundaries.mark_boundary`): decoded as written,
    flushed by the call from PostgreSQL 17 (``flush => true``); below 17 the
    WAL writer flushes it within ``wal_writer_delay``. ``watch`` reports a
    wait (a synchronous commit waiting for a ``synchronous_standby_names``
    standby: :mod:`pgpoll.source.waits`).
    """
    if transactional:
        sql = "SELECT pg_logical_emit_message(true, %s, %s)::text"
    elif conn.server_version >= _FLUSH_ARG_SINCE:
        sql = "SELECT pg_logical_emit_message(false, %s, %s, true)::text"
    else:
        sql = "SELECT pg_logical_emit_message(false, %s, %s)::text"
    try:
        with pinned_transaction(conn, readonly=False) as cur:
            if transactional:
                cur.execute("SET LOCAL synchronous_commit = on")
            if watch is not None:  # watched through the commit, where a synchronous standby is waited for
                watch.start(backend_pid(cur))
            cur.execute(sql, (HEARTBEAT_PREFIX, content))
            lsn = Lsn.parse(cur.fetchone()[0])
        return lsn
    except psycopg2.Error as exc:
        raise translate(exc, slot=slot) from None
    finally:
        if watch is not None:
            watch.stop()


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown"
    text = exc.message if isinstance(exc, PgpollError) else str(exc)
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = getattr(state.next_action, "sleep", None)
        if wait is None:
            wait = state.upcoming_sleep
        log.warning("%s failed (attempt %d): %s; retrying in %.1f s", what, state.attempt_number, _reason(exc), wait)

    return before_sleep


def retrying(
    max_seconds: float = 120.0,
    attempts: int = 8,
    *,
    what: str = "server call",
    retry_on: Callable[[BaseException], bool] = is_transient,
) -> Retrying:
    """Bounded exponential backoff for transient failures only; each retry is logged.

    Use as ``for attempt in retrying(): with attempt: ...``.
    """
    return Retrying(
        retry=retry_if_exception(retry_on),
        stop=stop_after_attempt(attempts) | stop_after_delay(max_seconds),
        wait=wait_exponential(multiplier=0.5, max=10),
        before_sleep=_log_retry(what),
        reraise=True,
    )


def transient_at_start(exc: BaseException) -> bool:
    """True for a failure to connect at start that a retry can get past (see :data:`START_RETRY_SQLSTATES`)."""
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return sqlstate in START_RETRY_SQLSTATES


class ControlConnection:
    """The driver's connection, reconnecting when it is lost mid-run."""

    def __init__(self, target: ConnectionTarget, slot: str) -> None:
        self.target = target
        self.slot = slot
        self.conn: Any = None

    def open(self) -> None:
        """Connect and make one round trip; a failure fails at once (exit 4) unless the server is starting up.

        The round trip matters behind a pooler, which accepts the login itself
        and reaches the server only with the first statement.
        """
        for attempt in retrying(what="connecting to the server", retry_on=transient_at_start):
            with attempt:
                self._connect()
                try:
                    with self.conn.cursor() as cur:
                        cur.execute("SELECT 1")
                except psycopg2.Error as exc:
                    self.close()
                    raise translate(exc, slot=self.slot) from None

    def _connect(self) -> None:
        self.close()
        self.conn = connect(self.target, application_name=f"pgpoll ingest {self.slot} (control)")

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)``; on a transient failure reconnect and retry (each retry logged)."""
        for attempt in retrying(what=f"control connection of slot {self.slot}"):
            with attempt:
                if self.conn is None or self.conn.closed:
                    self._connect()
                try:
                    return fn(self.conn)
                except Exception as exc:
                    if is_transient(exc) or (self.conn is not None and self.conn.closed):
                        self.close()
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def slot_info(self) -> slot_access.SlotInfo:
        """The slot's current row."""
        return self.call(lambda c: slot_access.get_slot(c, self.slot))

    def advance(self, lsn: Lsn) -> slot_access.AdvanceResult:
        """Advance the slot (idempotent; read and advance in one transaction)."""
        watch = CallWatch(self.target, f'the advance of slot "{self.slot}"')  # a failover slot's advance can wait
        return self.call(lambda c: slot_access.advance_slot(c, self.slot, lsn, watch=watch))

    def on_standby(self) -> bool:
        """True when the server is a hot standby (:func:`pgpoll.source.server_state.in_recovery`)."""
        return self.call(in_recovery)

    def emit_heartbeat(self, run_id: str) -> Lsn | None:
        """Write a transactional heartbeat message, committed synchronously; returns its LSN.

        None on a hot standby, where nothing is written: a standby is
        read-only (a transactional ``pg_logical_emit_message`` there fails
        with XX000 "cannot assign TransactionIds during recovery",
        ``GetNewTransactionId`` in ``varsup.c``). A slot on a
        standby then advances only to the last change it returned, unless
        the primary writes ``pgpoll.heartbeat`` messages, which reach the
        standby's slot with the WAL (the how-to "Capture from a standby").
        """
        if self.on_standby():
            log.info('the server is a hot standby: no heartbeat for slot "%s" (nothing can be written there)', self.slot)
            return None
        content = json.dumps({"run": run_id, "at": datetime.now(UTC).isoformat()})
        watch = CallWatch(self.target, f'the heartbeat of slot "{self.slot}"')
        return self.call(lambda conn: write_heartbeat(conn, content, transactional=True, slot=self.slot, watch=watch))

    def wal_lag(self) -> int | None:
        """Bytes between the current WAL end and the slot's confirmed position."""
        return self.slot_info().lag_bytes

    def close(self) -> None:
        """Close the connection."""
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None
