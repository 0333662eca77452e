"""One ``pgpoll materialize`` at a time per destination: a renewed lease file in DEST.

``DEST/.pgpoll-materialize.lease`` holds ``{run, expires_at}`` (a name that
starts with ``.``, so Spark and table readers skip it, and that is no table
directory). A run takes it before it touches anything in DEST and a second
run finds it and stops at once with :class:`SlotBusyError` (exit 3), having
changed nothing. While the run works, a thread renews it every third of its
time to live; a run that was killed (SIGKILL) leaves a lease that expires
after ``ttl`` seconds (60 by default), and the next run takes it over. The
file is removed at the end, so DEST holds only the tables afterwards.

The lease is the fast answer, not the guarantee: a run that stalled past its
lease, clocks that disagree, or a store without atomic create could let two
runs both believe they hold it. For ``--format delta`` the guarantee is the
Delta log's own atomic commit of the version the run read
(:mod:`pgpoll.materialize.delta.table`): two writers can never both publish
on one version; for ``--format parquet`` it is the state's own record log
(:mod:`pgpoll.materialize.state_log`), created exclusively before a swap.
``PGPOLL_TEST_NO_LOCK=1`` turns the lease off (tests of that guarantee alone).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from pgpoll.errors import SinkError, SlotBusyError
from pgpoll.sink.commit.lease import lease_disabled
from pgpoll.sink.stores.filesystem import OutputFs

log = logging.getLogger("pgpoll.materialize")

LEASE_FILE = ".pgpoll-materialize.lease"
TTL_SECONDS = 60.0


def _parse(text: str) -> tuple[str, float] | None:
    try:
        data = json.loads(text)
        return str(data["run"]), float(data["expires_at"])
    except (ValueError, KeyError, TypeError):
        return None


class DestLease:
    """The lease of one destination for one materialize run; a context manager."""

    def __init__(self, fs: OutputFs, *, run: str, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.time,
                 enabled: bool | None = None) -> None:
        self.fs = fs
        self.run = run
        self.ttl = ttl
        self.clock = clock
        self.enabled = (not lease_disabled()) if enabled is None else enabled
        self.path = fs.path(LEASE_FILE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    def _text(self) -> str:
        return json.dumps({"run": self.run, "expires_at": self.clock() + self.ttl}, sort_keys=True)

    def holder(self) -> tuple[str, float] | None:
        """``(run, expires_at)`` of the current lease; None when there is none or it is damaged."""
        try:
            return _parse(self.fs.read_text(self.path)) if self.fs.exists(self.path) else None
        except SinkError:
            return None  # released between the check and the read

    def _busy(self, run: str, expires_at: float) -> SlotBusyError:
        left = max(0.0, expires_at - self.clock())
        return SlotBusyError(
            f"another pgpoll materialize (run {run}) is writing {self.fs.root} (its lease expires in {left:.0f} s)",
            f"wait for it to finish; if it died, rerun after {left:.0f} s",
        )

    def acquire(self) -> None:
        """Take the lease, or raise :class:`SlotBusyError` at once when another run's lease has not expired."""
        if not self.enabled:
            return
        self.fs.mkdirs(self.fs.path())
        if not self.fs.create_exclusive(self.path, self._text()):
            current = self.holder()
            if current is not None and current[0] != self.run and current[1] > self.clock():
                raise self._busy(*current)
            # expired or damaged: set it aside (one run wins the rename), then create ours
            stale = f"{self.path}.stale-{self.run}"
            try:
                self.fs.rename(self.path, stale)
            except SinkError:
                raise self._busy(*(self.holder() or ("unknown", self.clock()))) from None
            self.fs.delete(stale)
            if current is not None:
                log.warning("taking over the expired materialize lease of run %s", current[0])
            if not self.fs.create_exclusive(self.path, self._text()):
                raise self._busy(*(self.holder() or ("unknown", self.clock())))
        self.held = True
        self._thread = threading.Thread(target=self._renew_loop, name="pgpoll-materialize-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                current = self.holder()
                if current is None or current[0] != self.run:
                    log.warning("the materialize lease of %s was taken over by another run", self.fs.root)
                    return
                self.fs.write_text(self.path, self._text())
            except Exception as exc:  # a failed renewal must not kill the run; the commit is the guarantee
                log.warning("could not renew the materialize lease: %s", exc)

    def release(self) -> None:
        """Stop renewing and remove the lease (only when this run still holds it)."""
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = self.holder()
        if current is not None and current[0] == self.run:
            self.fs.delete(self.path)
        self.held = False

    def __enter__(self) -> DestLease:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
