"""Transaction ids as PostgreSQL compares them: full 64-bit ids and snapshots.

The logical decoding functions return the 32-bit ``xid`` of each row; a
snapshot (``pg_current_snapshot()``) speaks in full 64-bit ids (``xid8``:
the epoch in the high 32 bits). Comparing the two across wraparound needs
the 32-bit id widened with the right epoch: the one that puts it within
2^31 below a full id known to be newer, read in the same session — exactly
what ``widen_snapshot_xid`` in PostgreSQL's ``xid8funcs.c`` does.

A snapshot decides visibility of a committed transaction: ids below
``xmin`` are visible, ids at or above ``xmax`` are not, ids in between are
visible unless listed as in progress (``xip``). This is
``pg_visible_in_snapshot``; materialize uses it to know which changes a
snapshot's rows already hold. Pure code, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_EPOCH = 1 << 32
_HALF = 1 << 31


def widen_xid(xid: int, reference: int) -> int:
    """The full id of the 32-bit ``xid``, given a full id ``reference`` not older than it (by less than 2^31).

    ``reference`` is typically ``pg_snapshot_xmax(pg_current_snapshot())``
    read in the transaction that returned ``xid``.
    """
    if not 0 <= xid < _EPOCH:
        raise ValueError(f"not a 32-bit transaction id: {xid}")
    if reference < 0:
        raise ValueError(f"not a full transaction id: {reference}")
    full = (reference & ~(_EPOCH - 1)) | xid
    if full > reference:
        full -= _EPOCH  # the xid is from the previous epoch
    if full < 0 or reference - full >= _HALF:
        raise ValueError(f"transaction id {xid} is not within 2^31 below {reference}")
    return full


@dataclass(frozen=True)
class Snapshot:
    """A ``pg_snapshot``: ``xmin:xmax:xip,...`` in full ids."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    def visible(self, xid: int) -> bool:
        """Whether a committed transaction with full id ``xid`` is visible (``pg_visible_in_snapshot``)."""
        if xid < self.xmin:
            return True
        if xid >= self.xmax:
            return False
        return xid not in self.xip

    @property
    def text(self) -> str:
        """The snapshot as PostgreSQL prints it."""
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in self.xip)}"

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "xmin": self.xmin, "xmax": self.xmax, "xip": list(self.xip)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Snapshot:
        return Snapshot(int(data["xmin"]), int(data["xmax"]), tuple(int(x) for x in data.get("xip", ())))


def parse_snapshot(text: str) -> Snapshot:
    """``pg_current_snapshot()::text`` -> :class:`Snapshot`; ValueError on anything else."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"not a pg_snapshot: {text!r}")
    xmin, xmax = int(parts[0]), int(parts[1])
    xip = tuple(sorted(int(x) for x in parts[2].split(",") if x))
    if xmin > xmax or any(not xmin <= x < xmax for x in xip):
        raise ValueError(f"not a pg_snapshot: {text!r}")
    return Snapshot(xmin, xmax, xip)
