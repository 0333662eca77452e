"""What a materialize run is asked and what it reports: :class:`MaterializeOptions` and :class:`TableState`.

Both are imported from :mod:`pgpoll.materialize.run` as well, where the run
that takes the one and returns the other lives.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pgpoll.errors import ConfigError

REFUSED = "refused"
"""A table's ``mode`` when it was not built (across a gap without a snapshot after it, or behind batches ``pgpoll
retain`` removed without a snapshot holding them): the run exits 2 at its end."""


def refused_error(states: list[TableState]) -> ConfigError | None:
    """The run's error (exit 2) naming every table it refused, after the others were built (None: none refused)."""
    refused = [s for s in states if s.mode == REFUSED]
    if not refused:
        return None
    built = len(states) - len(refused)
    retained = all("pgpoll retain removed" in w for s in refused for w in s.warnings)  # (pgpoll.materialize.retained)
    return ConfigError(
        f"{len(refused)} table(s) refused {'for batches retention removed' if retained else 'across the gap'} "
        f"({', '.join(s.table for s in refused)}); "
        f"{built} other table(s) built. " + " ".join(w for s in refused for w in s.warnings),
        "the fix of each refused table follows its reason (`pgpoll resync`, or `pgpoll snapshot --tables`)",
    )


@dataclass(frozen=True)
class MaterializeOptions:
    """The options of ``pgpoll materialize`` and ``jobs/materialize.py``."""

    output: str
    tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    to: str | None = None
    full: bool = False
    catalog: str | None = None  # --format iceberg: the pyiceberg catalog's name (pgpoll.materialize.iceberg.catalog)
    pushgateway: str | None = None  # None: PGPOLL_PUSHGATEWAY (pgpoll.observe.runs)
    state_retention_hours: float | None = 168.0
    """How long superseded state versions stay (None: no maintenance; :mod:`pgpoll.materialize.maintenance`)."""


@dataclass
class TableState:
    """What a run did for one table (printed by the CLI)."""

    table: str
    path: str
    rows: int
    position: str | None
    mode: str  # full, incremental, unchanged, or refused (REFUSED: not built; ``warnings`` says why and the fix)
    batches: int = 0
    warnings: list[str] = field(default_factory=list)
    format: str = "parquet"
    version: int | None = None  # the Delta table's version (--format delta)
    snapshot: dict[str, Any] | None = None  # {"id", "complete", "converged"} of the snapshot the state is built on
    engine: str | None = None  # what computed the state: "driver" or "spark" (None: nothing to compute)
    maintenance: dict[str, Any] | None = None  # what maintenance did (pgpoll.materialize.maintenance; None: none ran)

    def to_json(self) -> str:
        """One line of JSON (``version`` only for Delta, ``engine`` only when a state was computed, ``maintenance``
        only when it ran)."""
        out = asdict(self)
        for optional in ("version", "engine", "maintenance"):
            if out[optional] is None:
                del out[optional]
        return json.dumps(out, sort_keys=True)

