"""A one-line progress display for long interactive work; silent in cron, CI and pipes.

Shown only when the stream is a terminal and neither ``CI`` nor
``PGPOLL_NO_PROGRESS`` is set. Updates are throttled and drawn over one line
(``\\r``); :meth:`Progress.done` clears it, so what a command prints for
machines (JSON lines on stdout) is never mixed with it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class Progress:
    """Throttled single-line status on a terminal (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(
            getattr(self.stream, "isatty", lambda: False)()
            and not os.environ.get("CI")
            and not os.environ.get("PGPOLL_NO_PROGRESS")
        )
        self.interval = interval
        self._last = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` (at most every ``interval`` seconds unless ``force``)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def done(self) -> None:
        """Clear the line."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
