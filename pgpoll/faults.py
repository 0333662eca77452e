"""Crash points for testing: ``PGPOLL_FAULT=<point>`` kills the process at that point.

Points, in the order a batch passes them: ``after-peek`` (the task has the
first peeked row), ``mid-write`` (the task has handed the first Arrow batch to
Spark's writer), ``after-write`` (the batch is staged), ``after-commit-log``
(published and recorded, slot not yet advanced), ``after-advance``; and for
``materialize --format iceberg``, ``materialize-before-commit`` (data files
written, catalog not yet committed) and ``materialize-after-commit``; for
``pgpoll compact``, ``compact-after-write`` (merged files written, no record)
and ``compact-after-record`` (record created, files not moved). A fault in
the task kills the Spark worker; the driver then kills itself too, so the
whole run dies as a real crash would. Exit status 137, like SIGKILL.
"""

from __future__ import annotations

import os
import sys

POINTS = ("after-peek", "mid-write", "after-write", "after-commit-log", "after-advance")
MATERIALIZE_POINTS = ("materialize-before-commit", "materialize-after-commit")
COMPACT_POINTS = ("compact-after-write", "compact-after-record")
TASK_POINTS = frozenset({"after-peek", "mid-write"})
FAULT_EXIT = 137


def configured() -> str | None:
    """The fault point set in the environment (None when unset)."""
    value = os.environ.get("PGPOLL_FAULT") or None
    return value if value in POINTS or value in MATERIALIZE_POINTS or value in COMPACT_POINTS else None


def crash_if(point: str, configured_point: str | None = None) -> None:
    """Die at once (no cleanup, no flush) when ``point`` is the configured fault."""
    if (configured_point if configured_point is not None else configured()) == point:
        sys.stderr.write(f"pgpoll: PGPOLL_FAULT={point}: crashing now\n")
        sys.stderr.flush()
        os._exit(FAULT_EXIT)
