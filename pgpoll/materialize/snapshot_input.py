"""What materialize needs of the snapshots under an output path: per table, the latest complete one.

``pgpoll snapshot`` writes (docs/reference/output-contract.md)
``PATH/_pgpoll/snapshots/<id>/plan.json`` (the tables, their key, columns
and chunk bounds), one ``<table dir>/chunk-<n>.json`` manifest per finished
chunk (its ``pg_current_snapshot()`` and files) and ``complete.json`` once
every chunk and the convergence LSN are in; the rows are Parquet under
``PATH/snapshots/<id>/<table dir>/``. Materialize is offline: it takes, per
table, the complete snapshot with the greatest id that holds the table, and
needs from it only the chunk bounds, each chunk's snapshot and files, the
column names and the LSNs. Ids sort by start time, so "greatest" is "latest".

The files are read through :mod:`pgpoll.sink.snapshot_store` (the one owner
of the format, over :class:`OutputFs`, no JVM); this module turns them into
typed values: bounds from JSON key values (int for integers, str for text
and uuid, ``"\\x.."`` hex for bytea), snapshots, columns with their types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.sink.snapshot_store import CompleteEntry, SnapshotStore, complete_snapshots, manifest_name, newest_holding
from pgpoll.sink.stores.filesystem import OutputFs
from pgpoll.typed.mapping import PgType
from pgpoll.typed.schemas import IDENTITY_FULL, ColumnSchema, TableSchema
from pgpoll.xids import Snapshot

SHARED = "shared"
CHUNKED = "chunked"


@dataclass(frozen=True)
class SnapshotColumn:
    """A column of the snapshot's rows: its name, the Parquet column holding it, its type."""

    name: str
    physical: str
    type: PgType


@dataclass(frozen=True)
class SnapshotChunk:
    """One chunk: rows with ``lo < key <= hi`` (None = open end; shared mode: no bounds), read under ``snapshot``."""

    n: int
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    snapshot: Snapshot
    files: tuple[str, ...]  # full paths


@dataclass(frozen=True)
class TableSnapshot:
    """One table of one complete snapshot."""

    snapshot_id: str
    schema: str
    table: str
    mode: str
    key: tuple[str, ...]
    identity: str | None
    columns: tuple[SnapshotColumn, ...]
    chunks: tuple[SnapshotChunk, ...]
    plan_lsn: int
    convergence_lsn: int | None
    #: the pieces of its recheck that read rows (:mod:`pgpoll.snapshot.recheck`): value sources for materialize
    rechecks: tuple[SnapshotChunk, ...] = ()
    #: the plan's ``server`` (system identifier, timeline; None in older plans): a gap on a new history needs it
    server: dict[str, Any] | None = None

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def shape(self) -> TableSchema:
        """The table's shape when the snapshot was planned (same content id as the typed tables give it:
        under REPLICA IDENTITY FULL every column is key)."""
        columns = tuple(ColumnSchema(c.name, c.type) for c in self.columns)
        key = tuple(c.name for c in columns) if self.identity == IDENTITY_FULL else self.key
        return TableSchema(self.schema, self.table, columns, key, self.identity)

    @property
    def min_xmin(self) -> int:
        """The smallest ``xmin`` of the chunks' snapshots: every transaction below it is visible to every chunk."""
        return min((c.snapshot.xmin for c in self.chunks), default=0)

    @property
    def files(self) -> list[str]:
        return [f for c in self.chunks for f in c.files]


def _bound(values: Any, kinds: list[str], where: str) -> tuple[Any, ...] | None:
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != len(kinds):
        raise SinkError(f"{where}: a chunk bound does not match the key", "run `pgpoll snapshot` again")
    out: list[Any] = []
    for v, kind in zip(values, kinds, strict=True):
        if kind == "bytea" and isinstance(v, str) and v.startswith("\\x"):
            out.append(bytes.fromhex(v[2:]))
        else:
            out.append(v)
    return tuple(out)


class SnapshotCatalog:
    """The complete snapshots of one output path, read once (plans and manifests are never rewritten)."""

    def __init__(self, fs: OutputFs) -> None:
        self.fs = fs
        self._plans: list[CompleteEntry] | None = None

    def _complete(self) -> list[CompleteEntry]:
        """``(store, plan, complete)`` of each complete snapshot, newest first."""
        if self._plans is None:
            self._plans = complete_snapshots(self.fs)
        return self._plans

    def table_dirs(self) -> set[str]:
        """The table directory names that some complete snapshot holds."""
        return {str(t["dir"]) for _store, plan, _done in self._complete() for t in plan.get("tables", ())}

    def latest(self, schema: str, table: str) -> TableSnapshot | None:
        """The table in the complete snapshot with the greatest id that holds it (None: no snapshot)."""
        found = newest_holding(self._complete(), schema, table)
        if found is None:
            return None
        (store, plan, done), entry = found
        return _table(store, plan, done, entry)


def _table(store: SnapshotStore, plan: dict[str, Any], done: dict[str, Any], t: dict[str, Any]) -> TableSnapshot:
    sid, directory = store.snapshot_id, str(t["dir"])
    kinds = [str(k) for k in t.get("key_kinds", ())]
    manifests = store.manifests(directory)
    chunks: list[SnapshotChunk] = []
    for c in t.get("chunks", ()):
        n = int(c["n"])
        manifest = manifests.get(n)
        if manifest is None:
            raise SinkError(f"snapshot {sid} is marked complete but chunk {n} of {t['schema']}.{t['table']} has no "
                            "manifest", f"run `pgpoll snapshot --tables {t['schema']}.{t['table']}` again")
        where = store.meta(directory, manifest_name(n))
        files = tuple(store.data(directory, f) for f in manifest.get("files", ()))
        chunks.append(SnapshotChunk(n, _bound(c.get("lo"), kinds, where), _bound(c.get("hi"), kinds, where),
                                    Snapshot.from_json(manifest["snapshot"]), files))
    rechecks: list[SnapshotChunk] = []
    for c in t.get("rechecks") or ():
        manifest = manifests.get(int(c["n"]))  # (none: the recheck was not needed, pgpoll.snapshot.recheck.needed)
        if manifest is not None and int(manifest.get("rows", 0)):
            files = tuple(store.data(directory, f) for f in manifest.get("files", ()))
            rechecks.append(SnapshotChunk(int(c["n"]), None, None, Snapshot.from_json(manifest["snapshot"]), files))
    columns = tuple(SnapshotColumn(str(c["name"]), str(c["physical"]), PgType.from_json(c["type"]))
                    for c in t.get("columns", ()))
    convergence = done.get("convergence_lsn_int")
    return TableSnapshot(
        snapshot_id=sid, schema=str(t["schema"]), table=str(t["table"]), mode=str(t.get("mode", SHARED)),
        key=tuple(str(k) for k in t.get("key", ())), identity=t.get("identity"), columns=columns,
        chunks=tuple(sorted(chunks, key=lambda ch: ch.n)), plan_lsn=int(plan.get("plan_lsn_int", 0)),
        convergence_lsn=int(convergence) if convergence is not None else None, rechecks=tuple(rechecks),
        server=plan["server"] if isinstance(plan.get("server"), dict) else None,
    )
