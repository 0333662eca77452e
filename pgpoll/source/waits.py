"""Never wait silently: watch a server call from a second connection, say what it waits for, end a hopeless wait.

Why: a peek, an advance or a slot's creation can wait on the server for as
long as something else holds it there — a lock, an old transaction a new
slot's snapshot must see end, or (PostgreSQL 17+, a failover slot) the
standbys named in ``synchronized_standby_slots``, which the server waits for
with no end (``WaitForStandbyConfirmation`` in ``slot.c``, reached from the
SQL peek and advance of a failover slot). The server's own WARNINGs about it
reach psycopg2 only once the call returns, so the run looked hung.

How: the caller takes its backend's pid with ``pg_backend_pid()`` *in the
same transaction as the call, before it* (behind a transaction pooler the
transaction is what stays on one server connection), and hands it to a
:class:`CallWatch`. Only a call still running after :data:`FIRST_LOOK`
seconds costs anything: the watch then opens a second connection and reads
the backend's ``pg_stat_activity`` row every :data:`POLL` seconds. A wait
(a lock, an IPC or timeout wait, or ``WaitForStandbyConfirmation``, which
PostgreSQL 17 files under ``Client``) is reported at once and every
:data:`EVERY` seconds after; a lock wait names the lock and the sessions
holding it (pid, how long their transaction has been open, application_name).
A ``WaitForStandbyConfirmation`` wait while a slot named in
``synchronized_standby_slots`` is missing, invalidated or inactive for
:data:`STANDBY_GRACE` seconds is cancelled (``pg_cancel_backend``): the call
fails with :class:`~pgpoll.errors.StandbyWaitError` (exit 4) naming the setting.
An inactive slot gets that grace because a standby that restarts comes back;
a slot that stays missing is a configuration left over from another server.

Some waits show no wait event: a logical slot created on a hot standby
reads the standby's WAL until the primary has logged a running-transactions
record that lets it build its first snapshot, and between two looks at the
replayed WAL the backend sleeps with ``pg_usleep`` (``read_local_xlog_page_guts``
in ``xlogutils.c``), so ``pg_stat_activity`` shows it active with no wait event
(or a short WAL read). A watch given a ``busy_note`` reports a call still
active after :data:`FIRST_LOOK` seconds and not in one of the waits above,
with the note saying what it most likely waits for
(:func:`standby_creation_note`).

Best effort: a watch that cannot connect or read says nothing and never
fails the call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2

from pgpoll.errors import StandbyWaitError
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.failover import standby_slots

log = logging.getLogger("pgpoll.source")

FIRST_LOOK = 5.0  # seconds: a call still running then is looked at (the first report comes within 10 s)
POLL = 1.0  # seconds between two looks
EVERY = 30.0  # seconds between two reports of the same call
STANDBY_GRACE = 60.0  # seconds a standby slot may stay unable to confirm before the wait is cancelled

STANDBY_WAIT = "WaitForStandbyConfirmation"
_WAIT_TYPES = frozenset({"Lock", "LWLock", "BufferPin", "IPC", "Timeout", "Extension", "InjectionPoint"})

_ACTIVITY = """
SELECT state, wait_event_type, wait_event, extract(epoch FROM now() - query_start)::float8
FROM pg_stat_activity WHERE pid = %s
"""
_LOCK = """
SELECT locktype, mode, coalesce(relation::regclass::text, transactionid::text, virtualxid, '')
FROM pg_locks WHERE pid = %s AND NOT granted LIMIT 1
"""
_BLOCKERS = """
SELECT pid, coalesce(application_name, ''), coalesce(state, ''),
       extract(epoch FROM now() - xact_start)::float8
FROM pg_stat_activity WHERE pid = ANY(pg_blocking_pids(%s)) ORDER BY xact_start LIMIT 3
"""


@dataclass(frozen=True)
class Activity:
    """The watched backend's ``pg_stat_activity`` row."""

    state: str | None
    wait_type: str | None
    wait_event: str | None
    seconds: float

    @property
    def waiting(self) -> bool:
        """True for a wait on something outside the call (not its own CPU, I/O or its client)."""
        return self.state == "active" and (self.wait_type in _WAIT_TYPES or self.wait_event == STANDBY_WAIT)


def backend_pid(cur: Any) -> int:
    """``pg_backend_pid()`` on ``cur``: call it in the transaction of the call to watch, before the call."""
    cur.execute("SELECT pg_backend_pid()")
    return int(cur.fetchone()[0])


class CallWatch:
    """Watches one call's backend from a second connection (see the module docstring).

    ``what`` names the call in messages (``'the peek of slot "s"'``);
    ``report`` receives each line (stderr through the caller's progress or log
    channel); ``target`` is where the second connection goes.
    """

    def __init__(
        self, target: ConnectionTarget, what: str, report: Callable[[str], None] | None = None,
        *, busy_note: str | None = None,
    ) -> None:
        self.target = target
        self.what = what
        self.report = report or log.warning
        self.busy_note = busy_note  # said of a call still active but not waiting on a lock or IPC (module docstring)
        self.verdict: StandbyWaitError | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def start(self, pid: int) -> None:
        """Begin watching backend ``pid`` (the call is about to be sent)."""
        self._pid = pid
        self._done.clear()
        self.verdict = None
        self._thread = threading.Thread(target=self._run, name="pgpoll-wait-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The call returned (or failed): stop watching."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        if self._done.wait(FIRST_LOOK):
            return
        conn: Any = None
        reported = -EVERY
        standby_bad_since: float | None = None
        try:
            while not self._done.is_set():
                try:
                    if conn is None:
                        conn = connect(self.target, application_name="pgpoll (wait watch)")
                    with conn.cursor() as cur:
                        activity = _activity(cur, self._pid)
                        if activity is not None and activity.waiting and not self._done.is_set():
                            now = time.monotonic()
                            problem = None
                            if activity.wait_event == STANDBY_WAIT:
                                raw, slots = standby_slots(cur)
                                problem = "; ".join(p for p in (s.problem for s in slots) if p) or None
                                standby_bad_since = (standby_bad_since or now) if problem else None
                                if (standby_bad_since is not None and now - standby_bad_since >= STANDBY_GRACE
                                        and self._cancel(cur, activity, raw, problem or "")):
                                    return
                            else:
                                standby_bad_since = None
                            if now - reported >= EVERY:
                                reported = now
                                self.report(self._describe(cur, activity, problem))
                        elif activity is None or not activity.waiting:
                            standby_bad_since = None
                            if (self.busy_note and activity is not None and activity.state == "active"
                                    and time.monotonic() - reported >= EVERY):
                                reported = time.monotonic()
                                self.report(f"{self.what} has been running on the server for {activity.seconds:.0f} s "
                                            f"(backend pid {self._pid}): {self.busy_note}")
                except Exception as exc:  # best effort: the call goes on whatever happens here
                    log.debug("wait watch of backend %s: %s", self._pid, exc)
                    _close(conn)
                    conn = None
                self._done.wait(POLL)
        finally:
            _close(conn)

    def _describe(self, cur: Any, activity: Activity, problem: str | None) -> str:
        head = (f"{self.what} has been waiting on the server for {activity.seconds:.0f} s "
                f"(backend pid {self._pid}, wait event {activity.wait_type}/{activity.wait_event})")
        if activity.wait_event == STANDBY_WAIT:
            tail = ("for the standbys named in synchronized_standby_slots to confirm the WAL it reads (a failover slot)"
                    + (f": {problem}; it is cancelled after {STANDBY_GRACE:.0f} s of that" if problem else ""))
            return f"{head}: {tail}"
        if activity.wait_type == "Lock":
            return f"{head}: {_lock_text(cur, self._pid)}"
        return head

    def _cancel(self, cur: Any, activity: Activity, raw: str, problem: str) -> bool:
        """Cancel the call; True when the server did. The verdict is set only then: set before, a cancel that
        failed (raised, or found no backend) would turn a later, unrelated error of the call into this one."""
        verdict = StandbyWaitError(
            f"{self.what} waited {activity.seconds:.0f} s for synchronized_standby_slots = '{raw}' to confirm WAL "
            f"and was cancelled: {problem}",
            "create the standby's physical slot and let it stream, or remove the slot from synchronized_standby_slots "
            "on this server (ALTER SYSTEM SET synchronized_standby_slots = '...'; SELECT pg_reload_conf()), "
            "e.g. on a promoted standby that still has the old primary's setting",
        )
        cur.execute("SELECT pg_cancel_backend(%s)", (self._pid,))
        row = cur.fetchone()
        if not (row and row[0]):  # the backend is gone (the call ended meanwhile): nothing was cancelled
            return False
        self.verdict = verdict
        self.report(verdict.message)
        return True


def _activity(cur: Any, pid: int) -> Activity | None:
    cur.execute(_ACTIVITY, (pid,))
    row = cur.fetchone()
    return Activity(row[0], row[1], row[2], float(row[3] or 0.0)) if row else None


def _lock_text(cur: Any, pid: int) -> str:
    """The lock the backend waits for and who holds it."""
    cur.execute(_LOCK, (pid,))
    lock = cur.fetchone()
    what = f"a {lock[1]} lock on {lock[0]} {lock[2]}".rstrip() if lock else "a lock"
    cur.execute(_BLOCKERS, (pid,))
    holders = [
        f"pid {p} (application_name '{app}', {state or 'unknown state'}, transaction open {age or 0:.0f} s)"
        for p, app, state, age in cur.fetchall()
    ]
    return f"it waits for {what}" + (f", held by {', '.join(holders)}" if holders else "")


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


@contextmanager
def watched(watch: CallWatch | None, cur: Any) -> Iterator[None]:
    """Watch the next call on ``cur`` (a psycopg2 cursor inside the call's transaction).

    A call the watch cancelled raises the watch's :class:`~pgpoll.errors.StandbyWaitError`
    instead of psycopg2's "canceling statement due to user request".
    """
    if watch is None:
        yield
        return
    watch.start(backend_pid(cur))
    try:
        yield
    except psycopg2.Error:
        watch.stop()
        if watch.verdict is not None:
            raise watch.verdict from None
        raise
    finally:
        watch.stop()


def standby_creation_note() -> str:
    """What a slot's creation on a hot standby waits for, and what speeds it (a :class:`CallWatch` ``busy_note``).

    A new slot needs a running-transactions WAL record from the primary
    (``SnapBuildFindSnapshot`` in ``snapbuild.c``), and more of them while
    transactions were running at the first. The primary's background writer
    logs one every 15 s (``LOG_SNAPSHOT_INTERVAL_MS`` in ``bgwriter.c``), and
    only when WAL was written since the last: an idle primary logs none.
    """
    return ("this server is a hot standby: a new slot waits for the primary to log a running-transactions record "
            "(every 15 s while it writes, none while it is idle), and for the transactions running then to end; "
            "run SELECT pg_log_standby_snapshot() on the primary to log one now")
