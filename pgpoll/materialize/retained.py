"""Materialize beside ``pgpoll retain``: registering the destination, and the tables whose old batches are gone.

``pgpoll retain`` removes batches below the output's retention floor
(:mod:`pgpoll.sink.commit.floor`), never past the position of a registered
destination (:mod:`pgpoll.sink.destinations`) nor what a table's newest
complete snapshot needs. So each run:

* registers its DEST under the output before it reads the commit log
  (:class:`Registration`; ``building`` holds retention at the floor the run
  saw), and records each table's new position when it ends;
* builds a table whose state is behind removed batches of it (a new
  destination, ``--full``, a state older than the floor) only on a snapshot
  that holds every removed change (:func:`retention_refusal`: every removed
  transaction visible to every chunk); such a state is rebuilt from the
  snapshot. Without one the table is refused (exit 2 at the run's end, the
  other tables built), naming the snapshot that repairs it: a state built
  from what is left would silently miss rows.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.materialize.run_types import REFUSED, TableState
from pgpoll.materialize.snapshot_input import TableSnapshot
from pgpoll.sink import destinations
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.history import History

log = logging.getLogger("pgpoll.materialize")

_FORMATS = {"DeltaMaterializer": "delta", "IcebergMaterializer": "iceberg", "Materializer": "parquet"}


def state_format(materializer: Any) -> str:
    """``parquet``, ``delta`` or ``iceberg``: the format a materializer writes (by its class or a base of it)."""
    return next((_FORMATS[c.__name__] for c in type(materializer).__mro__ if c.__name__ in _FORMATS), "parquet")


class Registration:
    """The run's destination in the output's registry (see the module docstring)."""

    def __init__(self, materializer: Any) -> None:
        self.fs = materializer.fs
        floor = read_floor(self.fs)
        self.before = destinations.find(self.fs, destinations.destination_key(
            materializer.dest.root, state_format(materializer), materializer.opts.catalog))
        self.started = destinations.start_run(self.fs, materializer.dest.root, state_format(materializer),
                                              materializer.opts.catalog, floor.seq if floor is not None else 0,
                                              uuid.uuid4().hex[:12])

    def abandon(self) -> None:
        """The run stopped before building anything: the registration as it was (none for a new destination)."""
        if self.before is None:
            destinations.unregister(self.fs, self.started.key)
        else:
            destinations.write(self.fs, self.before)

    def end(self, states: Sequence[TableState], high_water: Lsn | None) -> None:
        """Record the built tables' positions: each applied every record up to the run's high-water mark."""
        positions = {s.path.rstrip("/").rsplit("/", 1)[-1]: str(high_water) if high_water is not None else str(s.position)
                     for s in states if s.mode != REFUSED and s.position is not None}
        destinations.end_run(self.fs, self.started, positions)


def holds_removed(snap: TableSnapshot, gone: tuple[int, Lsn, int | None]) -> bool:
    """Whether ``snap`` holds every change of the removed batches: each of their transactions is visible to every
    chunk (below the smallest ``xmin``), or, for batches written without transaction ids, ended before its plan."""
    _seq, end, xid_max = gone
    if xid_max is not None:
        return bool(snap.chunks) and xid_max < snap.min_xmin
    return int(end) <= snap.plan_lsn


def effective_position(marker: dict[str, Any] | None, snap: TableSnapshot | None) -> Lsn | None:
    """Where the table's run starts: its state's position, or None when it builds anew (no state, ``--full``, a
    newer snapshot, recheck rows pending)."""
    if marker is None:
        return None
    if snap is not None and (marker.get("snapshot_id") != snap.snapshot_id or marker.get("snapshot_rechecks_pending")):
        return None
    return Lsn.parse(str(marker["position"]))


def rebuild_if_behind(history: History, name: str, marker: dict[str, Any] | None, rebuilt: set[str]
                      ) -> dict[str, Any] | None:
    """``marker``, or None when the state is behind batches retention removed (the run then rebuilds the table on
    the snapshot :func:`retention_refusal` found to hold them, and adds ``name`` to ``rebuilt``)."""
    if marker is None or history.lacks(name, Lsn.parse(str(marker["position"]))) is None:
        return marker
    rebuilt.add(name)
    return None


def retention_refusal(materializer: Any, history: History, name: str, parsed: tuple[str, str]) -> ConfigError | None:
    """Why table directory ``name`` cannot be built now that ``pgpoll retain`` removed batches it needs (None: it
    can); its state and snapshot are read only when retention removed batches of it."""
    if history.lacks(name, None) is None:
        return None  # no batch of it removed: no read
    qualified = f"{parsed[0]}.{parsed[1]}"
    marker, snap = materializer._read_marker(name), materializer.snapshots.latest(*parsed)
    gone = history.lacks(name, effective_position(marker, snap))
    if gone is None:
        return None
    if snap is not None and holds_removed(snap, gone):
        history.accept(name)  # rebuilt on the snapshot from the batches still there
        return None
    seq, end, _xid = gone
    have = (f"its newest complete snapshot {snap.snapshot_id} does not hold them" if snap is not None
            else "it has no complete snapshot")
    behind = "a new state" if marker is None else f"its state (at {marker['position']})"
    return ConfigError(
        f"{qualified}: pgpoll retain removed its batches up to {end} (commit-log record {seq}), which {behind} "
        f"needs, and {have}: a state built from what is left would miss rows",
        f"run `pgpoll snapshot --tables {qualified}`, then materialize again",
    )
