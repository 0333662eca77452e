"""The snapshot driver's watcher thread: progress from the chunk manifests, and the table leases kept alive.

Tasks report nothing while they run; what they publish is the progress. Every
2 s the thread reads the manifests that appeared (only those), then shows
"chunks done/total, rows, rows/s" on a terminal or logs one line per finished
chunk elsewhere (cron, Airflow); every 15 s it renews the run's table leases.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence

from pgpoll.errors import PgpollError, SlotBusyError
from pgpoll.sink.lease import Lease
from pgpoll.sink.snapshot_store import SnapshotStore, manifest_name

log = logging.getLogger("pgpoll.snapshot")


class Watcher:
    """A driver thread: counts manifests every 2 s (progress) and renews the table leases every 15 s."""

    def __init__(self, store: SnapshotStore, dirs: Sequence[str], total: int, leases: Sequence[Lease],
                 show: Callable[[str], None] | None) -> None:
        self.store, self.dirs, self.total, self.leases, self.show = store, list(dirs), total, list(leases), show
        self.seen: dict[tuple[str, int], int] = {}
        self.rows_before = 0
        self.chunks_before = 0
        self.lost: PgpollError | None = None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="pgpoll-snapshot-progress", daemon=True)

    def start(self) -> None:
        """Count the chunks done before this run, then watch."""
        self.tick(initial=True)
        self.chunks_before = len(self.seen)
        self.started = time.monotonic()
        self._thread.start()

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
        """Read the manifests that appeared since the last tick."""
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
                    self.rows_before += rows
                elif self.show is None:
                    log.info("chunk %d of %s: %d row(s) (%d/%d chunks)", n, d, rows, len(self.seen), self.total)
        if not initial and self.show is not None:
            rows = sum(self.seen.values())
            rate = (rows - self.rows_before) / max(time.monotonic() - self.started, 1e-3)
            self.show(f"snapshot: {len(self.seen)}/{self.total} chunks, {rows:,} rows, {rate:,.0f} rows/s")

    def stop(self) -> None:
        """Stop the thread, after one last count (every finished chunk is logged)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(PgpollError):
            self.tick()
