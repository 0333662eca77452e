"""``pgpoll materialize --format iceberg``: each table's current state as an Apache Iceberg table in a catalog.

The state is computed exactly as for the other formats
(:class:`pgpoll.materialize.run.Materializer`: in the driver with pyarrow,
or with Spark); what differs is where the previous state comes from and how
the new one is published:

* the catalog (:mod:`pgpoll.materialize.iceberg.catalog`) holds the table
  ``(schema,), table``; the run pins its current snapshot, and the
  commit-log position, schema id and output the state reflects are pgpoll's
  properties in the newest pgpoll snapshot's summary;
* the previous rows are read with pyiceberg's Arrow scan: every data file of
  a small state; of a large one, when exact, only the files whose key range
  may hold a key the changes touch, chosen exactly as for Delta
  (:func:`pgpoll.materialize.delta.files.refusal`,
  :func:`pgpoll.materialize.driver.files.touched_files`), the others kept;
* the new state (an Arrow table; a Spark-computed one is collected to Arrow
  in the driver) is sorted on the key and written by pyiceberg in files of
  at most :data:`pgpoll.materialize.delta.files.TARGET_ROWS` rows, and
  committed as one snapshot that deletes the files it replaces
  (:mod:`pgpoll.materialize.iceberg.table`).

Data files of a run that died before its commit are in no snapshot: readers
never see them (an orphan-file clean-up removes them). A commit lost to
another writer removes the run's files and fails (exit 5). The destination
lease (exit 3) lives in DEST (``--to``, default ``OUTPUT/state``), also when
the catalog is remote: runs that share a catalog should share a DEST.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.errors import ConfigError, first_line
from pgpoll.lsn import Lsn
from pgpoll.materialize.change_summary import identity_segments, replay_key
from pgpoll.materialize.delta import files as delta_files
from pgpoll.materialize.delta.files import PartialPlan, laid_out, refusal, scan_changes, write_options
from pgpoll.materialize.driver.files import comparable_key, touched_files
from pgpoll.materialize.driver.run import parquet_files, sorted_on, state_schema
from pgpoll.materialize.driver.state import (
    DRIVER_AFFECTED_BYTES,
    DRIVER_AFFECTED_ROWS,
    DRIVER_BYTES,
    DRIVER_ROWS,
    touched_key_values,
)
from pgpoll.materialize.iceberg.catalog import describe, identifier, open_catalog
from pgpoll.materialize.iceberg.table import IcebergStateTable, PinnedSnapshot, write_data_files, write_parquet_files
from pgpoll.materialize.iceberg.types import iceberg_type, same_type, to_state_types
from pgpoll.materialize.run import MaterializeOptions, Materializer, TableState, _align
from pgpoll.materialize.state import StateColumn
from pgpoll.sink import layout
from pgpoll.sink.commit.history import History
from pgpoll.sink.stores.filesystem import local_path

log = logging.getLogger("pgpoll.materialize")


@dataclass
class IcebergTableState(TableState):
    """What a ``--format iceberg`` run did for one table: its catalog, the snapshot it is at, and the files the
    commit rewrote, added and kept."""

    catalog: str | None = None
    iceberg_snapshot: int | None = None
    files: dict[str, int] | None = None

    def to_json(self) -> str:
        """One line of JSON (``files`` only when a snapshot was committed)."""
        out = json.loads(super().to_json())
        if self.files is None:
            del out["files"]
        return json.dumps(out, sort_keys=True)


class IcebergMaterializer(Materializer):
    """Materializes the typed tables of one output path as Iceberg tables (see the module docstring)."""

    publishes_by_rename = False  # one catalog commit per table: works with object-store warehouses

    def __init__(self, spark: Any, opts: MaterializeOptions, stop: Any = None) -> None:
        remote_to = opts.to is not None and local_path(opts.to) is None
        # a remote DEST is checked before anything opens it: without a catalog, exit 2 naming the settings
        self.catalog = open_catalog(opts.catalog, opts.to or "") if remote_to else None
        super().__init__(spark, opts, stop)  # (a remote DEST holds the lease, through pgpoll's store client)
        if self.catalog is None:
            self.catalog = open_catalog(opts.catalog, local_path(self.dest.root) or self.dest.root)
        self.run_id = uuid.uuid4().hex[:12]
        self._pins: dict[str, PinnedSnapshot] = {}
        self._plans: dict[str, PartialPlan] = {}
        self._snapshots: dict[str, int | None] = {}
        self._files: dict[str, dict[str, int]] = {}
        self._maintenance: dict[str, dict[str, Any]] = {}  # what expiring snapshots did, per table
        self._locations: dict[str, str] = {}
        self._columns: dict[str, list[StateColumn]] = {}  # per table: the state's columns (Spark: to align kept rows)

    def iceberg_table(self, name: str) -> IcebergStateTable:
        """The catalog table of the table directory name ``name`` (``<schema>.<table>``, escaped)."""
        parsed = layout.parse_table_dir_name(name)
        if parsed is None:
            raise ConfigError(f"{name} is no table name", "check the output")
        return IcebergStateTable(self.catalog, identifier(*parsed), self.fs.root)

    def _table(self, name: str, parsed: tuple[str, str], history: History) -> TableState:
        state = super()._table(name, parsed, history)
        state.format = "iceberg"
        state.maintenance = self._maintenance.get(name)
        state.path = self._locations.get(name, state.path)
        return IcebergTableState(**{f.name: getattr(state, f.name) for f in fields(state)}, catalog=describe(self.catalog),
                                 iceberg_snapshot=self._snapshots.get(name), files=self._files.get(name))

    def _read_marker(self, name: str) -> dict[str, Any] | None:
        pinned = self._pins[name] = self.iceberg_table(name).pin()
        self._snapshots[name] = pinned.snapshot_id
        if pinned.table is not None:
            self._locations[name] = str(pinned.table.location())
        meta = pinned.meta
        if (pinned.snapshot_id is None or self.opts.full or meta is None or meta.get("output") != self.fs.root
                or not pinned.tasks or "schema-id" not in meta):
            return None  # a full rebuild, committed over the pinned snapshot
        return {"position": meta["position"], "rows": int(meta.get("rows", "0")), "schema_id": meta["schema-id"],
                "snapshot_id": meta.get("snapshot-id") or None}

    def _arrow(self, name: str, paths: Sequence[str] | None, schema: pa.Schema) -> pa.Table | None:
        """The pinned snapshot's rows (of ``paths``; None: all) as Arrow, typed like the state where Iceberg
        holds the same type."""
        pinned = self._pins[name]
        table = self.iceberg_table(name).read(pinned, paths)
        return None if table is None else to_state_types(table, schema)

    def _same_schema(self, pinned: PinnedSnapshot, schema: pa.Schema) -> bool:
        """Whether the table's Iceberg schema is the state's (files kept beside new ones must read alike)."""
        current = pinned.table.schema().fields
        return [f.name for f in current] == schema.names and all(
            same_type(f.field_type, iceberg_type(schema.field(f.name).type)) for f in current)

    def driver_previous(self, name: str, events: Any, key: list[str], columns: list[StateColumn],
                        schema: Any) -> tuple[Any, str | None]:
        """The pinned snapshot's rows the driver needs: every file of a small table; of a large one, only the
        files that may hold a key the changes touch (the others are kept by the commit); or why Spark does it."""
        import pyarrow.compute as pc

        pinned = self._pins[name]
        self._plans.pop(name, None)
        stats = pinned.stats(key)
        if self.engine == "driver" or (sum(f.records for f in stats) <= DRIVER_ROWS
                                       and sum(f.size for f in stats) <= DRIVER_BYTES):
            return self._arrow(name, None, schema), None
        if events is None:
            return None, "no new changes (a large Iceberg state)"
        meta = pinned.meta or {}
        previous_key = replay_key(self.store.load(meta["schema-id"])) if meta.get("schema-id") else []
        truncated = bool(pc.any(pc.equal(events.column("_op"), pa.scalar("T"))).as_py())
        why = refusal(stats, key, previous_key, truncated=truncated, identity_changes=False,
                      same_schema=self._same_schema(pinned, schema))
        if why is None and pinned.has_row_deletes:
            why = "row deletes written by another engine"
        if why is None and not comparable_key(schema, key):
            why = "a key compared by Spark's rules (not an integer or a string)"
        touched = touched_files(stats, key, touched_key_values(events, columns, key)) if why is None else None
        if why is None and touched is None:
            why = "too many key comparisons"
        affected = tuple(f for f in stats if touched is not None and f.path in touched)
        if why is None and (sum(f.records for f in affected) > DRIVER_AFFECTED_ROWS
                            or sum(f.size for f in affected) > DRIVER_AFFECTED_BYTES):
            why = "the changes touch a large part of the state"
        if why is not None:
            return None, f"{why} (a large Iceberg state)"
        self._plans[name] = PartialPlan(affected, tuple(f for f in stats if f not in affected))
        log.info("%s: rewriting %d of %d file(s) in the driver", name, len(affected), len(stats))
        table = self._arrow(name, [f.path for f in affected], schema) if affected else None
        return (table if table is not None else schema.empty_table()), None

    def _read_previous(self, name: str, events: Any = None, key: Sequence[str] = (),
                       columns: Sequence[StateColumn] = ()) -> Any:
        """The pinned snapshot's rows as a Spark frame, read with pyiceberg: for an incremental run, when exact,
        only the files that may hold a key ``events`` touch (found with the Delta path's Spark join:
        :func:`pgpoll.materialize.delta.files.scan_changes`), the others kept by the commit; else every file."""
        self._plans.pop(name, None)
        self._columns[name] = list(columns)
        pinned = self._pins[name]
        schema = state_schema(columns)
        stats = pinned.stats(key)
        why = "no new changes" if events is None else self._refusal(pinned, stats, list(key), schema)
        scan = None
        if why is None:
            scan = scan_changes(self.spark, events, columns, key, stats)
            identity_changes = scan.shapes > 1 and len(identity_segments(self.summaries[name], self.store)) > 1
            why = "a TRUNCATE" if scan.truncated else "the replica identity changed" if identity_changes else None
        if why is not None or scan is None:
            log.info("%s: rewriting every file (%s)", name, why)
            return self._frame(self._arrow(name, None, schema), schema)
        affected = tuple(f for f in stats if f.path in scan.touched)
        self._plans[name] = PartialPlan(affected, tuple(f for f in stats if f not in affected))
        log.info("%s: rewriting %d of %d file(s)", name, len(affected), len(stats))
        return self._frame(self._arrow(name, [f.path for f in affected], schema) if affected else None, schema)

    def _refusal(self, pinned: PinnedSnapshot, stats: Sequence[Any], key: list[str], schema: pa.Schema) -> str | None:
        """Why an incremental run with Spark rewrites every file, as far as the state tells (None: the changes
        decide)."""
        meta = pinned.meta or {}
        previous_key = replay_key(self.store.load(meta["schema-id"])) if meta.get("schema-id") else []
        why = refusal(stats, key, previous_key, truncated=False, identity_changes=False,
                      same_schema=self._same_schema(pinned, schema))
        if why is None and pinned.has_row_deletes:
            why = "row deletes written by another engine"
        if why is None and not comparable_key(schema, key):
            why = "a key that is not an integer or a string"
        return why

    def _frame(self, table: pa.Table | None, schema: pa.Schema) -> Any:
        """``table`` (None: no rows) as a Spark frame."""
        return self.spark.createDataFrame(table if table is not None else schema.empty_table())

    def _write(self, name: str, frame: Any, marker: dict[str, Any], key: list[str]) -> int:
        """Commit a state computed by Spark: laid out and cut into files of at most ``TARGET_ROWS`` rows as for
        Delta, written by Spark as Parquet into a scratch directory of a local output, then rewritten by pyiceberg
        one file at a time (the state never has to fit in the driver); a remote output collects it to Arrow."""
        from pyspark.sql.pandas.types import to_arrow_schema

        wanted = to_arrow_schema(frame.schema, timezone="UTC")
        scratch = self.fs.path("_pgpoll", f"iceberg-{self.run_id}", name)
        local = local_path(scratch)
        if local is None:
            table = frame.toArrow()
            return self._write_arrow(name, pa.Table.from_arrays(
                [table.column(i).cast(f.type) for i, f in enumerate(wanted)], schema=wanted), marker, key)
        plan = self._plans.pop(name, None)
        if plan is not None and not self._same_schema(self._pins[name], wanted):
            log.info("%s: the new state's schema differs from the kept files'; rewriting every file", name)
            kept = self._frame(self._arrow(name, [f.path for f in plan.kept], wanted) if plan.kept else None, wanted)
            frame, plan = frame.unionByName(_align(kept, self._columns.get(name, []))), None
        laid_out(frame, key, None).write.options(**write_options()).parquet(scratch)
        try:
            paths = parquet_files(local)
            rows = sum(pq.read_metadata(p).num_rows for p in paths) + (sum(f.records for f in plan.kept) if plan else 0)
            return self._commit(name, wanted, rows, marker, plan,
                                lambda metadata, io: write_parquet_files(metadata, io, paths, wanted))
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _write_arrow(self, name: str, table: Any, marker: dict[str, Any], key: list[str]) -> int:
        """Commit the state (or, with a plan, the rewritten files' rows) as the table's next snapshot."""
        plan = self._plans.pop(name, None)
        laid = sorted_on(table, key)
        rows = int(table.num_rows) + (sum(f.records for f in plan.kept) if plan is not None else 0)
        return self._commit(name, table.schema, rows, marker, plan,
                            lambda metadata, io: write_data_files(metadata, io, laid, delta_files.TARGET_ROWS))

    def _commit(self, name: str, schema: pa.Schema, rows: int, marker: dict[str, Any], plan: PartialPlan | None,
                write: Callable[[Any, Any], list[Any]]) -> int:
        """Commit the files ``write`` writes (``rows`` rows of the state, with the plan's kept files) as the next
        snapshot; returns the state's rows."""
        pinned = self._pins[name]
        properties = {"position": marker["position"], "schema-id": marker["schema_id"], "table": marker["table"],
                      "rows": rows, "run": self.run_id}
        if marker.get("snapshot_id"):
            properties["snapshot-id"] = marker["snapshot_id"]
        replaces = [pinned.tasks[f.path].file for f in plan.affected] if plan is not None else None
        target = self.iceberg_table(name)
        snapshot, added = target.commit(pinned, schema, write, replaces, properties, int(Lsn.parse(marker["position"])),
                                        force=self.opts.full or name in self.rebuilt)
        if snapshot is None:
            log.info("%s: position %s was already applied; nothing committed", name, marker["position"])
            return int((pinned.meta or {}).get("rows", rows))
        self._snapshots[name] = snapshot
        self._files[name] = (plan or PartialPlan(pinned.stats(()), ())).counts(len(added))
        if self.opts.state_retention_hours is not None:
            try:  # under the destination lease (pgpoll.materialize.maintenance)
                self._maintenance[name] = target.expire(self.opts.state_retention_hours)
            except Exception as exc:  # the state is committed; the next run expires them
                log.warning("%s: expiring old snapshots failed: %s", name, first_line(exc))
        loaded = target.load()
        if loaded is not None:
            self._locations[name] = str(loaded.location())
        return rows
