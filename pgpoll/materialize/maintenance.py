"""State maintenance inside ``materialize``: how long superseded versions stay, and when a run tidies up.

A Delta or Iceberg state gains a version (snapshot) per run that changed
something, and an incremental Delta run leaves the files it rewrote on the
store. After months of 5-minute runs that is tens of thousands of log
entries and files. So ``materialize``, under its destination lease (the
only writer of DEST: maintenance never races a commit, which is pinned
without retry), tidies each table it committed to:

* Delta, every :data:`MAINTAIN_EVERY` versions: a checkpoint
  (``create_checkpoint``), log clean-up (``cleanup_metadata``: the table's
  ``delta.logRetentionDuration``, 30 days by default) and a vacuum of the
  files no version within the retention needs (``vacuum``). Never a
  bin-pack compaction: the key-ordered files of
  :mod:`pgpoll.materialize.delta.files` are what incremental runs rely on,
  and ``optimize.compact`` would scatter keys.
* Iceberg, at every commit: snapshots older than the retention expire
  (pyiceberg 0.12's ``table.maintenance.expire_snapshots().older_than``,
  the current snapshot never). pyiceberg deletes no data or manifest files
  when snapshots expire, and has no orphan-file removal: those stay until an
  engine that has them (Spark's ``expire_snapshots`` procedure) runs.

The retention (``--state-retention``, ``PGPOLL_STATE_RETENTION``; default 7
days) is how far back time travel and readers that started before a run keep
working; ``off`` turns maintenance off.
"""

from __future__ import annotations

import re

DEFAULT_RETENTION = "7d"
MAINTAIN_EVERY = 10
"""A Delta table is tidied when a run's commit crosses a multiple of this many versions."""
_UNITS = {"d": 24.0, "h": 1.0, "m": 1 / 60}
_FORM = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([dhm]?)\s*$")


def parse_retention(text: str) -> float | None:
    """``7d``, ``168h``, ``90m`` or a number of hours as hours; ``off`` as None (no maintenance).

    Raises :class:`ValueError` naming the accepted forms.
    """
    if text.strip().lower() == "off":
        return None
    found = _FORM.match(text.lower())
    if found is None:
        raise ValueError(f"{text!r} is no retention: use a number with d, h or m (7d, 168h, 90m), or off")
    return float(found.group(1)) * _UNITS[found.group(2) or "h"]


def due(before: int | None, after: int) -> bool:
    """Whether a Delta commit from version ``before`` (None: a new table) to ``after`` crosses a multiple of
    :data:`MAINTAIN_EVERY` (vacuum's own commits shift versions: a crossing, not ``after % 10 == 0``)."""
    return before is not None and after // MAINTAIN_EVERY > before // MAINTAIN_EVERY
