"""Progress from inside a batch task to the driver, while the task runs.

Spark hands accumulators to the driver only when a task ends, and the server
builds a peek's whole result before its first row arrives, so a long batch was
silent for its whole length. This side channel is a small TCP listener on the
driver (the address executors already reach: ``spark.driver.host``) to which the
task sends one JSON line about once a second: first ``{"phase": "server"}``
while the server decodes, then ``{"phase": "fetch", "rows": n, "changes": m}``.

It is best effort by design: a task that cannot connect (a firewall between
executors and driver) works exactly as before, only silently; a line without the
run's random token is ignored. Nothing here can fail a batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("pgpoll.ingest")


@dataclass
class BatchProgress:
    """What the driver knows of the batch in flight."""

    batch: int
    phase: str = "starting"
    rows: int = 0
    changes: int = 0
    started: float = field(default_factory=time.monotonic)
    note: str | None = None  # a line the task wants shown as it is (the server call waits: pgpoll.source.waits)

    @property
    def seconds(self) -> float:
        """Seconds since the batch started."""
        return time.monotonic() - self.started

    def describe(self) -> str:
        """One line for a person: the phase, rows fetched and decoded, rows per second."""
        if self.phase == "fetch":
            rate = self.rows / self.seconds if self.seconds > 0 else 0.0
            return (
                f"batch {self.batch}: {self.rows:,} rows fetched, {self.changes:,} changes decoded "
                f"({rate:,.0f} rows/s, {self.seconds:.0f} s)"
            )
        if self.phase == "server":
            return f"batch {self.batch}: the server is decoding the slot ({self.seconds:.0f} s)"
        return f"batch {self.batch}: starting ({self.seconds:.0f} s)"


@dataclass(frozen=True)
class ChannelAddress:
    """Where a task sends progress; pickled into the batch spec."""

    host: str
    port: int
    token: str


class ProgressListener:
    """The driver's end: accepts task connections and keeps the latest progress of the current batch."""

    def __init__(self, host: str, on_update: Callable[[BatchProgress], None]) -> None:
        self.token = secrets.token_hex(16)
        self.current: BatchProgress | None = None
        self._on_update = on_update
        self._lock = threading.Lock()
        listener = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for raw in self.rfile:
                    listener._receive(raw)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, 0), Handler)
        self.address = ChannelAddress(host, int(self._server.server_address[1]), self.token)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pgpoll-progress", daemon=True)
        self._thread.start()

    def start_batch(self, number: int) -> None:
        """A new batch begins: progress lines now count for it."""
        with self._lock:
            self.current = BatchProgress(number)

    def _receive(self, raw: bytes) -> None:
        try:
            message: dict[str, Any] = json.loads(raw)
        except ValueError:
            return
        if message.get("token") != self.token:
            return
        with self._lock:
            current = self.current
            if current is None or message.get("batch") != current.batch:
                return
            current.phase = str(message.get("phase", current.phase))
            current.rows = int(message.get("rows", current.rows))
            current.changes = int(message.get("changes", current.changes))
            note = message.get("note")
            current.note = str(note) if note else None
        try:
            self._on_update(current)
        except Exception:  # display problems never reach the task or the run
            log.debug("progress display failed", exc_info=True)

    def close(self) -> None:
        """Stop listening."""
        self._server.shutdown()
        self._server.server_close()


class ProgressReporter:
    """The task's end: at most one line a second, silently off when the driver cannot be reached."""

    def __init__(self, address: ChannelAddress | None, batch: int, interval: float = 1.0) -> None:
        self.batch = batch
        self.interval = interval
        self._last = 0.0
        self._sock: socket.socket | None = None
        self._token = address.token if address is not None else ""
        self._lock = threading.Lock()  # a wait watch reports from its own thread
        if address is not None:
            try:
                self._sock = socket.create_connection((address.host, address.port), timeout=2.0)
            except OSError:
                self._sock = None

    @property
    def connected(self) -> bool:
        """True while lines can reach the driver (False: nobody listens, or the connection broke)."""
        return self._sock is not None

    def report(self, phase: str, rows: int = 0, changes: int = 0, *, force: bool = False, note: str | None = None) -> None:
        """Send the task's state (throttled unless ``force``); ``note``: a line for the driver to show as it is."""
        with self._lock:
            sock = self._sock
            if sock is None:
                return
            now = time.monotonic()
            if not force and now - self._last < self.interval:
                return
            self._last = now
            message: dict[str, Any] = {"token": self._token, "batch": self.batch, "phase": phase, "rows": rows,
                                       "changes": changes}
            if note:
                message["note"] = note
            try:
                sock.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                self.close()

    def close(self) -> None:
        """Disconnect."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


class BatchProgressLog:
    """Shows a batch's progress: a live line on a terminal, a log line at most every ``every`` seconds otherwise."""

    def __init__(self, show: Callable[[str], None] | None, every: float = 30.0) -> None:
        self._show = show
        self._every = every
        self._logged: dict[int, float] = {}

    def __call__(self, progress: BatchProgress) -> None:
        if progress.note:  # a waiting server call: always said, terminal or not (pgpoll.source.waits)
            log.warning("batch %d: %s", progress.batch, progress.note)
        text = progress.describe()
        if self._show is not None:
            self._show(text)
            return
        if progress.seconds < self._every:
            return  # short batches stay quiet in cron: their commit line says it all
        last = self._logged.get(progress.batch, 0.0)
        if progress.seconds - last >= self._every:
            self._logged[progress.batch] = progress.seconds
            log.info("%s", text)
