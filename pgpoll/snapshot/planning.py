"""The snapshot's plan document: what is read, in which chunks, and the arguments a rerun must match to resume.

``plan.json`` is written once, before any chunk is read (format in
:mod:`pgpoll.sink.snapshot_store`); a rerun with the same normalised
arguments resumes it, as long as the captured tables are still the same
tables with the same shape (same schema ids): the chunks read already then
hold the rows in the form the missing ones will have. Otherwise the rerun
starts a new snapshot. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.snapshot_store import FORMAT, now_iso
from pgpoll.typed.rows import ColumnLedger, TypedLayout

if TYPE_CHECKING:
    from pgpoll.source.snapshot.catalog import SnapshotTable
    from pgpoll.source.snapshot.reads import ChunkSpec


def normalised_args(
    *, slot: str, plugin: str, publications: Sequence[str], tables: Sequence[str], exclude_tables: Sequence[str],
    row_filters: Sequence[str], chunk_rows: int, mode: str = "auto", chunk_seconds: float | None = None,
) -> dict[str, Any]:
    """The arguments that decide what a snapshot reads (order and repetition do not matter)."""
    args: dict[str, Any] = {
        "slot": slot, "plugin": plugin, "publications": sorted(set(publications)), "tables": sorted(set(tables)),
        "exclude_tables": sorted(set(exclude_tables)), "row_filters": sorted(set(row_filters)),
        "chunk_rows": chunk_rows,
    }
    if mode != "auto":
        args["mode"] = mode
    if chunk_seconds is not None:
        args["chunk_seconds"] = chunk_seconds
    return args


def chunk_from_json(data: Mapping[str, Any]) -> ChunkSpec:
    """The ``ChunkSpec`` of a plan's chunk entry."""
    from pgpoll.source.snapshot.reads import ChunkSpec

    return ChunkSpec.from_json(dict(data))


def table_entry(t: SnapshotTable, chunks: Sequence[ChunkSpec], rechecks: Sequence[ChunkSpec] = ()) -> dict[str, Any]:
    """One table of the plan (``t`` a ``SnapshotTable``): its typed columns under their physical names, its chunks,
    why it got its mode, and its recheck pieces (:mod:`pgpoll.snapshot.recheck`)."""
    schema = t.table_schema
    typed = TypedLayout.build([schema], ColumnLedger())
    physical = {name: phys for phys, name, _t in typed.columns}
    return {
        "schema": t.schema, "table": t.table, "dir": layout.table_dir_name(t.schema, t.table), "mode": t.mode,
        "key": list(t.key), "identity": t.identity, "key_kinds": list(t.key_kinds),
        "columns": [{"name": c.name, "physical": physical[c.name], "type": c.type.to_json()} for c in t.columns],
        "schema_id": schema.schema_id, "relfilenode": int(t.relfilenode), "row_filter": t.row_filter,
        "column_list": None if t.column_list is None else list(t.column_list),
        "chunks": [c.to_json() for c in chunks], "mode_reason": t.mode_reason,
        "rechecks": [c.to_json() for c in rechecks],
    }


def build_plan(
    snapshot_id: str, *, slot: str, plugin: str, publications: Sequence[str], args: Mapping[str, Any],
    plan_lsn: int, entries: Sequence[Mapping[str, Any]], server: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole ``plan.json`` document; ``server`` the source's system identifier and timeline at planning (a gap
    marked on a new history takes only a snapshot of that history: ``CommitRecord.covered_by``)."""
    return {"server": dict(server) if server is not None else None,
        "format": FORMAT, "snapshot_id": snapshot_id, "slot": slot, "plugin": plugin,
        "publications": list(publications), "args": dict(args), "created_at": now_iso(),
        "plan_lsn": str(Lsn(plan_lsn)), "plan_lsn_int": plan_lsn, "tables": [dict(e) for e in entries],
    }


def same_server(plan: Mapping[str, Any], server: Mapping[str, Any]) -> bool:
    """True when the plan was made on ``server`` (system and timeline), or names none (older plans: same as before).

    Chunks read on the old timeline of a failover hold rows of a history the
    new primary does not have: a snapshot is resumed only on the server it
    was planned on.
    """
    planned = plan.get("server")
    return not isinstance(planned, dict) or dict(planned) == dict(server)


def same_tables(plan: Mapping[str, Any], tables: Sequence[SnapshotTable]) -> bool:
    """True when ``tables`` are the plan's tables, each with the shape (schema id) the plan recorded."""
    planned = {(e["schema"], e["table"]): e.get("schema_id") for e in plan.get("tables", ())}
    now = {(t.schema, t.table): t.table_schema.schema_id for t in tables}
    return planned == now
