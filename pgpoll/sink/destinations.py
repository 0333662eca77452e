"""Registered state destinations: which ``materialize --to DEST`` read this output, and how far each has applied.

``pgpoll retain`` removes old batches; a destination that has not applied
them yet would silently lose them. So ``materialize`` registers each DEST it
writes under the *output* (a write to the output, besides the schema files
it already saves), one small file per destination::

    PATH/_pgpoll/destinations/<key>.json
    {"dest": ..., "format": ..., "catalog": ..., "tables": {"<dir>": "<position>"},
     "building": {"floor": N, "since": ...} | null, "registered_at": ..., "updated_at": ..., "run": ...}

``tables`` maps each typed table directory the destination holds to the
commit-log position its state has applied (every record ending at or below
it); retention keeps every record past the smallest of them. ``building``
is set when a run starts, before it reads the log, with the retention floor
it saw then: until the run ends, retention removes nothing past that floor,
so a run that races ``pgpoll retain`` either sees the new floor (and refuses
or rebuilds on a snapshot) or is seen by it. A run that dies leaves
``building`` set: retention then holds there and says so, naming the
destination; the next run of it clears it, or ``pgpoll retain --unregister DEST``
removes the registration (a destination that is gone for good).

One ``materialize`` runs per destination (its lease), so each file has one
writer; it is rewritten whole. ``<key>`` is a hash of the format, the
destination and the catalog, so the same DEST under two formats is two
registrations.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.records import utc_now
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.sink")

DESTINATIONS = f"{layout.META}/destinations"


def destination_key(dest: str, fmt: str, catalog: str | None = None) -> str:
    """The file name (without ``.json``) of a destination's registration."""
    return hashlib.sha256(f"{fmt}\0{dest}\0{catalog or ''}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Destination:
    """One registered destination (see the module docstring)."""

    dest: str
    format: str
    catalog: str | None = None
    tables: dict[str, str] = field(default_factory=dict)
    building: dict[str, Any] | None = None
    registered_at: str = field(default_factory=utc_now)
    updated_at: str = field(default_factory=utc_now)
    run: str | None = None

    @property
    def key(self) -> str:
        return destination_key(self.dest, self.format, self.catalog)

    @property
    def name(self) -> str:
        """How messages name it."""
        return f"{self.dest} ({self.format}{', catalog ' + self.catalog if self.catalog else ''})"

    def position(self) -> Lsn | None:
        """The smallest position of its tables (None: it holds no table yet)."""
        return min((Lsn.parse(p) for p in self.tables.values()), default=None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Destination:
        data = json.loads(text)
        if not isinstance(data, dict) or "dest" not in data or "format" not in data:
            raise ValueError("not a destination registration")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _path(fs: OutputFs, key: str) -> str:
    return fs.path(DESTINATIONS, f"{key}.json")


def registered(fs: OutputFs) -> list[Destination]:
    """Every registered destination, by name; an unreadable registration is an error (it may hold back retention)."""
    out: list[Destination] = []
    for name, is_dir, _size in fs.list(fs.path(DESTINATIONS)):
        if is_dir or not name.endswith(".json") or name.startswith(("_", ".")):
            continue
        where = fs.path(DESTINATIONS, name)
        try:
            out.append(Destination.from_json(fs.read_text(where)))
        except (ValueError, TypeError) as exc:
            raise SinkError(f"the destination registration {where} is unreadable: {exc}",
                            "delete it and run that destination's materialize again (it registers itself)") from None
    return sorted(out, key=lambda d: (d.dest, d.format))


def find(fs: OutputFs, key: str) -> Destination | None:
    """The registration with ``key`` (None: not registered)."""
    found = fs.read_tagged(_path(fs, key))
    if found is None:
        return None
    try:
        return Destination.from_json(found[0])
    except (ValueError, TypeError):
        return None  # damaged: the run that writes it next replaces it


def write(fs: OutputFs, dest: Destination) -> None:
    """Write (or replace) a destination's registration."""
    fs.mkdirs(fs.path(DESTINATIONS))
    fs.write_text(_path(fs, dest.key), dest.to_json())


def start_run(fs: OutputFs, dest: str, fmt: str, catalog: str | None, floor: int, run: str) -> Destination:
    """Register ``dest`` (if new) as building, holding retention at ``floor`` (the floor its run has seen)."""
    key = destination_key(dest, fmt, catalog)
    current = find(fs, key) or Destination(dest=dest, format=fmt, catalog=catalog)
    started = replace(current, building={"floor": floor, "since": utc_now()}, updated_at=utc_now(), run=run)
    write(fs, started)
    return started


def end_run(fs: OutputFs, started: Destination, positions: dict[str, str]) -> None:
    """The run is over: its tables' new ``positions`` are recorded and ``building`` cleared."""
    tables = dict(started.tables)
    tables.update(positions)
    write(fs, replace(started, tables=tables, building=None, updated_at=utc_now()))


def unregister(fs: OutputFs, dest: str) -> list[Destination]:
    """Remove every registration of ``dest`` (any format); returns those removed."""
    gone = [d for d in registered(fs) if d.dest == dest or d.dest.rstrip("/") == dest.rstrip("/") or d.key == dest]
    for d in gone:
        fs.delete(_path(fs, d.key))
    return gone
