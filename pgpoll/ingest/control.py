"""The driver's control connection: the run's advisory lock, preflight, heartbeat, advance.

The lock is a PostgreSQL session advisory lock derived from the slot name
(``pg_try_advisory_lock(1885892720, hashtext(slot))``), held on this
connection for the whole run: a second run on the same slot exits 3 at once.
When the connection is lost (server restart, terminated backend) it is
re-opened and the lock taken again before anything else happens; if another
run took the lock meanwhile, this run stops with exit 3.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable, Optional, TypeVar

import psycopg2
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from pgpoll.errors import SlotBusyError
from pgpoll.ingest.batch_assembler import HEARTBEAT_PREFIX
from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.server_errors import is_transient, translate

LOCK_CLASS = 1885892720  # 'pgpp'
T = TypeVar("T")


def retrying(max_seconds: float = 120.0, attempts: int = 8) -> Retrying:
    """Bounded exponential backoff for transient failures only."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts) | stop_after_delay(max_seconds),
        wait=wait_exponential(multiplier=0.5, max=10),
        reraise=True,
    )


class ControlConnection:
    """The driver's connection, with the run's lock and reconnect-on-loss."""

    def __init__(self, target: ConnectionTarget, slot: str) -> None:
        self.target = target
        self.slot = slot
        self.conn: Any = None

    def open(self) -> None:
        """Connect and take the lock (exit 3 when another run holds it)."""
        for attempt in retrying():
            with attempt:
                self._connect_and_lock()

    def _connect_and_lock(self) -> None:
        self.close()
        conn = connect(self.target, application_name=f"pgpoll ingest {self.slot} (control)")
        try:
            with conn.cursor() as cur:
                cur.execute("SET synchronous_commit = on")
                cur.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, self.slot))
                locked = bool(cur.fetchone()[0])
        except psycopg2.Error as exc:
            conn.close()
            raise translate(exc, slot=self.slot) from None
        if not locked:
            conn.close()
            raise SlotBusyError(
                f'another pgpoll run holds the lock for slot "{self.slot}"',
                "only one run per slot at a time: wait for it to finish (this run did nothing)",
            )
        self.conn = conn

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)``; on a transient failure reconnect, re-lock and retry."""
        for attempt in retrying():
            with attempt:
                if self.conn is None or self.conn.closed:
                    self._connect_and_lock()
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
        """Advance the slot (idempotent)."""
        return self.call(lambda c: slot_access.advance_slot(c, self.slot, lsn))

    def emit_heartbeat(self, run_id: str) -> Lsn:
        """Write a transactional heartbeat message; returns its LSN."""
        content = json.dumps({"run": run_id, "at": datetime.now(timezone.utc).isoformat()})

        def emit(conn: Any) -> Lsn:
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", (HEARTBEAT_PREFIX, content))
                    return Lsn.parse(cur.fetchone()[0])
            except psycopg2.Error as exc:
                raise translate(exc, slot=self.slot) from None

        return self.call(emit)

    def wal_lag(self) -> Optional[int]:
        """Bytes between the current WAL end and the slot's confirmed position."""
        return self.slot_info().lag_bytes

    def close(self) -> None:
        """Close the connection (releases the lock)."""
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None
