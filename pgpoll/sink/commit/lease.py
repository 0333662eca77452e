"""A renewed lease in the output: the fast "busy" answer, without any session state on the server.

``PATH/_pgpoll/lease.json`` holds ``{run, slot, expires_at}``. A run takes it
at start (:meth:`Lease.acquire` raises :class:`SlotBusyError`, exit 3, at once
when another run's unexpired lease is there), renews it while it works (the
caller calls :meth:`Lease.renew` at least every ``ttl / 2`` seconds, e.g. per
batch) and releases it at the end. A run that died leaves a lease that
expires after ``ttl`` (60 s by default) — at once for a run on the same host
whose process is gone (the lease records host and PID), so a rerun right
after a crash or a SIGKILL is not refused.

The same mechanism guards other things with their own file: ``path`` (relative
to the output) and ``what`` (how a busy message names the other run) default to
the ingest lease; ``pgpoll snapshot`` takes one lease per table it reads
(:mod:`pgpoll.sink.snapshot_store`).

The lease is only the fast path. Two runs can both believe they hold it
(a stalled run whose lease expired, clocks that disagree, a store without
atomic create); correctness rests on the commit log's compare-and-set
(:mod:`pgpoll.sink.commit.batches`), which the lease never replaces. The test-only
switch ``PGPOLL_TEST_NO_LOCK=1`` turns the lease off, so tests can prove the
fence alone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pgpoll.errors import PgpollError, SlotBusyError
from pgpoll.sink import layout
from pgpoll.sink.stores.filesystem import OutputFs

log = logging.getLogger("pgpoll.sink")

TTL_SECONDS = 60.0
_HOST = socket.gethostname()
NO_LOCK_ENV = "PGPOLL_TEST_NO_LOCK"


def lease_disabled() -> bool:
    """True when ``PGPOLL_TEST_NO_LOCK=1`` turns the fast path off (tests of the fence alone)."""
    return os.environ.get(NO_LOCK_ENV, "") == "1"


@dataclass(frozen=True)
class LeaseHolder:
    """What ``lease.json`` says: who holds the output and until when (seconds since the epoch)."""

    run: str
    slot: str
    expires_at: float
    host: str = ""
    pid: int = 0

    def to_json(self) -> str:
        """The lease file's content (``expires_at`` as ISO 8601 UTC too, for people)."""
        when = datetime.fromtimestamp(self.expires_at, UTC).isoformat()
        return json.dumps({"run": self.run, "slot": self.slot, "expires_at": self.expires_at, "expires": when,
                           "host": self.host, "pid": self.pid}, sort_keys=True)

    def dead_here(self) -> bool:
        """True when the holder ran on this host and its process is gone (killed, crashed): no need to wait.

        A holder on another host, or one written without host and pid, is only
        judged by its expiry.
        """
        if not self.host or self.pid <= 0 or self.host != _HOST:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    @classmethod
    def parse(cls, text: str) -> LeaseHolder | None:
        """The holder, or None for a damaged file (treated as expired)."""
        try:
            data = json.loads(text)
            return cls(run=str(data["run"]), slot=str(data["slot"]), expires_at=float(data["expires_at"]),
                       host=str(data.get("host", "")), pid=int(data.get("pid", 0)))
        except (ValueError, KeyError, TypeError):
            return None


class Lease:
    """The lease of one output for one run."""

    def __init__(
        self, fs: OutputFs, *, run: str, slot: str, ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.time, enabled: bool | None = None,
        path: str = layout.LEASE, what: str = "ingest run", holds: str = "the output",
    ) -> None:
        self.fs = fs
        self.run = run
        self.slot = slot
        self.ttl = ttl
        self.clock = clock
        self.enabled = (not lease_disabled()) if enabled is None else enabled
        self.path = fs.path(path)
        self.what = what
        self.holds = holds
        self.held = False

    def _read(self) -> tuple[LeaseHolder | None, str | None]:
        """The current holder and the lease file's tag (``(None, None)``: no lease file; a damaged one has a tag)."""
        found = self.fs.read_tagged(self.path)
        if found is None:
            return None, None
        return LeaseHolder.parse(found[0]), found[1]

    def holder(self) -> LeaseHolder | None:
        """The current holder (None: no lease file, or a damaged one)."""
        return self._read()[0]

    def _busy(self, other: LeaseHolder) -> SlotBusyError:
        left = max(0.0, other.expires_at - self.clock())
        return SlotBusyError(
            f'another {self.what} ({other.run}, slot "{other.slot}") holds {self.holds} {self.fs.root} '
            f"(its lease expires in {left:.0f} s)",
            f"wait for it to finish; if it died, rerun after {left:.0f} s",
        )

    def _check_free(self, current: LeaseHolder | None) -> None:
        """SlotBusyError when ``current`` is another run's unexpired lease."""
        if current is not None and current.run != self.run and current.expires_at > self.clock():
            if current.dead_here():
                log.warning("run %s holding the output's lease is gone (process %d); taking the lease over",
                            current.run, current.pid)
                return
            raise self._busy(current)

    def _mine(self) -> LeaseHolder:
        return LeaseHolder(run=self.run, slot=self.slot, expires_at=self.clock() + self.ttl, host=_HOST, pid=os.getpid())

    def _take(self) -> bool:
        """One attempt to make the lease file this run's: create it, or swap out what was read (True: held)."""
        current, tag = self._read()
        if tag is None:
            return self.fs.create_exclusive(self.path, self._mine().to_json())
        self._check_free(current)
        if current is not None and current.run != self.run:
            log.warning("taking over the expired lease of run %s", current.run)
        return self.fs.swap(self.path, self._mine().to_json(), tag)

    def acquire(self) -> None:
        """Take the lease; :class:`SlotBusyError` at once when another run's lease has not expired.

        Taking it is a create-if-absent or a compare-and-swap of the file read
        (:meth:`OutputFs.swap`), so of two runs taking an expired lease
        together exactly one gets it where the store is fenced.
        """
        if not self.enabled:
            return
        self.fs.mkdirs(self.path.rsplit("/", 1)[0])
        for _attempt in range(3):
            if self._take():
                self.held = True
                return
            current, _tag = self._read()
            if current is not None and current.run != self.run:
                self._check_free(current)  # another run got it first: busy, unless it already died
        raise SlotBusyError(f"another {self.what} is taking the lease of {self.holds}", "rerun in a minute")

    def renew(self) -> None:
        """Extend the lease by ``ttl``; :class:`SlotBusyError` when another run has taken it over meanwhile."""
        if not self.enabled:
            return
        try:
            if not self._take():
                current, _tag = self._read()
                self._check_free(current)  # replaced between the read and the swap: by whom?
                if not self._take():
                    raise SlotBusyError(f"another {self.what} took the lease of {self.holds}", "rerun in a minute")
        except SlotBusyError:
            self.held = False
            raise
        self.held = True

    def release(self) -> None:
        """Give the lease up (only when this run still holds it)."""
        if not self.enabled or not self.held:
            return
        current = self.holder()
        if current is not None and current.run == self.run:
            self.fs.delete(self.path)
        self.held = False


class LeaseKeeper:
    """Renews the output's lease from a thread while the run works (a batch can outlast the lease's TTL).

    Losing the lease is not fatal by itself — the commit log's fence decides who
    publishes — but it means another run believes this one died, so the run
    stops before its next batch (exit 3).
    """

    def __init__(self, lease: Lease, every: float = 15.0) -> None:
        self.lease = lease
        self.lost: PgpollError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), name="pgpoll-lease", daemon=True)
        self._thread.start()

    def _loop(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.lease.renew()
            except SlotBusyError as exc:
                self.lost = exc
                return
            except PgpollError as exc:  # a storage hiccup: try again at the next tick
                log.warning("could not renew the output's lease: %s", exc.message)

    def check(self) -> None:
        """Raise the busy error if another run took the lease over."""
        if self.lost is not None:
            raise self.lost

    def stop(self) -> None:
        """Stop renewing."""
        self._stop.set()
        self._thread.join(timeout=5)
