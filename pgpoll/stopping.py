"""Stopping a job (ingest, materialize) cleanly on SIGINT or SIGTERM.

A signal only *asks* the run to stop: the handler records it and returns, so no
``KeyboardInterrupt`` unwinds through py4j or a half-written commit. The run
checks :attr:`StopRequest.requested` at its safe points (before each batch, after a
failed Spark job); a batch in flight is cancelled through Spark
(``cancelAllJobs``, from a watcher thread, never from the handler) and its
staging is abandoned — nothing was published and the slot was not advanced, so
the next run peeks those changes again. Batches committed before the signal
stay committed. The exit code is 128 + the signal number (130, 143).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopRequestedError(Exception):
    """Raised at a job's safe point once a stop was requested (the job then reports "interrupted")."""


class StopRequest:
    """A flag a signal handler sets, with callbacks run on a watcher thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._handler: Callable[[int, Any], None] | None = None

    @property
    def requested(self) -> bool:
        """True once a stop was asked for."""
        return self._event.is_set()

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum or signal.SIGINT)

    def request(self, signum: int) -> None:
        """Ask the run to stop (safe to call from a signal handler: it only sets state)."""
        if self.signum is None:
            self.signum = signum
        self._event.set()
        threading.Thread(target=self._run_callbacks, name="pgpoll-stop", daemon=True).start()

    def on_request(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` (on a thread) when a stop is requested; returns a function that removes it."""
        with self._lock:
            self._callbacks.append(callback)
        if self.requested:
            threading.Thread(target=self._run_callbacks, daemon=True).start()

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    def _run_callbacks(self) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            # a failed cancel must not crash the watcher; the run still stops at its next check
            with contextlib.suppress(Exception):
                callback()


def install(stop: StopRequest) -> Callable[[], None]:
    """Route SIGINT and SIGTERM to ``stop``; returns a function restoring the previous handlers.

    Only in the main thread (Python's rule for signal handlers); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        stop.request(signum)

    for signum in HANDLED:
        previous[signum] = signal.signal(signum, handler)
    stop._handler = handler

    def restore() -> None:
        stop._handler = None
        for signum, old in previous.items():
            signal.signal(signum, old)

    return restore


def reclaim(stop: StopRequest | None) -> None:
    """Put ``stop``'s handlers back after something replaced them.

    Creating a SparkContext installs PySpark's own SIGINT handler (it cancels
    every job, then raises ``KeyboardInterrupt`` in whatever py4j call is
    running: tracebacks and a half-done step). Called right after the session
    exists; does nothing unless :func:`install` was called for ``stop``.
    """
    if stop is None or stop._handler is None or threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        signal.signal(signum, stop._handler)
