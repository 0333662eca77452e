"""The snapshot driver's watcher thread: progress from the chunk manifests, and the table leases kept alive.

Tasks report nothing while they run; what they publish is the progress
(chunks read in seconds, so a finished chunk is a fine grain). Every 2 s the
thread reads the manifests that appeared (only those) and, on a terminal,
shows rows read, chunks done of total, the rate and the time left; elsewhere
(cron, Airflow) it logs that line every 30 s, as ``pgpoll ingest`` logs its
batches. Every 15 s it renews the run's table leases.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgpoll.errors import PgpollError, SlotBusyError
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.snapshot_store import RECHECK_FIRST, SnapshotStore, manifest_name

log = logging.getLogger("pgpoll.snapshot")

LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class Counts:
    """What a progress line says: chunks (and recheck pieces) done of their totals, rows, time since the start."""

    chunks: int
    total: int
    rows: int
    rows_before: int
    chunks_before: int
    seconds: float
    pieces: int = 0
    pieces_total: int = 0

    def line(self) -> str:
        """``snapshot: 1,200,000 rows, 12/20 chunks, 310,000 rows/s, about 4 s left``."""
        rate = (self.rows - self.rows_before) / max(self.seconds, 1e-3)
        text = f"snapshot: {self.rows:,} rows, {self.chunks}/{self.total} chunks, {rate:,.0f} rows/s"
        done_now = self.chunks - self.chunks_before
        left = self.total - self.chunks
        if left > 0 and done_now > 0:
            text += f", about {_duration(left * self.seconds / done_now)} left"
        if self.pieces_total and self.chunks >= self.total:
            text += f", recheck {self.pieces}/{self.pieces_total}"
        return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Watcher:
    """A driver thread: counts manifests every 2 s (progress) and renews the table leases every 15 s."""

    def __init__(self, store: SnapshotStore, dirs: Sequence[str], total: int, leases: Sequence[Lease],
                 show: Callable[[str], None] | None, pieces: int = 0) -> None:
        self.store, self.dirs, self.total, self.leases, self.show = store, list(dirs), total, list(leases), show
        self.pieces_total = pieces
        self.seen: dict[tuple[str, int], int] = {}
        self.rows_before = 0
        self.chunks_before = 0
        self.lost: PgpollError | None = None
        self.started = time.monotonic()
        self._logged = self.started
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="pgpoll-snapshot-progress", daemon=True)

    def start(self) -> None:
        """Count the chunks done before this run, then watch."""
        self.tick(initial=True)
        self.chunks_before = self.chunks_done()
        self.started = self._logged = time.monotonic()
        self._thread.start()

    def chunks_done(self) -> int:
        """Chunks published so far (recheck pieces not counted)."""
        return sum(1 for _d, n in self.seen if n < RECHECK_FIRST)

    def rows(self) -> int:
        """Rows of the chunks published so far."""
        return sum(rows for (_d, n), rows in self.seen.items() if n < RECHECK_FIRST)

    def counts(self) -> Counts:
        """The current figures."""
        return Counts(self.chunks_done(), self.total, self.rows(), self.rows_before, self.chunks_before,
                      time.monotonic() - self.started, len(self.seen) - self.chunks_done(), self.pieces_total)

    def _loop(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(2.0):
            try:
                self.tick()
                if time.monotonic() - renewed >= 15.0:
                    for lease in self.leases:
                        lease.renew()
                    renewed = time.monotonic()
            except SlotBusyError as exc:
                self.lost = exc
            except PgpollError as exc:  # a storage hiccup: next tick
                log.debug("snapshot progress: %s", exc.message)

    def tick(self, initial: bool = False) -> None:
        """Read the manifests that appeared since the last tick, and show or log the progress."""
        with self._lock:
            self._tick(initial)

    def _tick(self, initial: bool) -> None:
        for d in self.dirs:
            for name, _is_dir, _size in self.store.fs.list(self.store.meta(d)):
                if not name.startswith("chunk-") or not name.endswith(".json"):
                    continue
                n = int(name[len("chunk-"):-len(".json")])
                if (d, n) in self.seen:
                    continue
                try:
                    rows = int(json.loads(self.store.fs.read_text(self.store.meta(d, manifest_name(n)))).get("rows", 0))
                except (PgpollError, ValueError):
                    continue
                self.seen[(d, n)] = rows
        if initial:
            self.rows_before = self.rows()
            return
        if self.show is not None:
            self.show(self.counts().line())
        elif time.monotonic() - self._logged >= LOG_EVERY_S:
            self._logged = time.monotonic()
            log.info("%s", self.counts().line())

    def stop(self) -> None:
        """Stop the thread, after one last count."""
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(PgpollError):
            self.tick()
