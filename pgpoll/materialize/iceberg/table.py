"""The Iceberg edge of ``pgpoll materialize --format iceberg``: pin a table's snapshot, read its files, commit once.

No JVM: pyiceberg writes the data files (Parquet with Iceberg field ids and
per-file statistics) and commits them through the catalog. Each table and run
is **one snapshot**, made by one ``Transaction``: a schema update when the
state's columns changed (``update_schema().union_by_name`` and
``delete_column``), then ``update_snapshot().overwrite()`` (an
``_OverwriteFiles`` producer) that deletes exactly the data files the run
replaces (every file of the pinned snapshot, or only those holding a touched
key: :mod:`pgpoll.materialize.delta.files`) and appends the new ones. That is
a file-level overwrite: the snapshot before it and the one it makes are both
whole states, unlike ``Table.overwrite(df, filter)``, which commits a delete
and an append as two snapshots (the first one missing rows).

Three guarantees, resting on the catalog's atomic commit of a table's
metadata pointer (an ``UPDATE ... WHERE metadata_location = <old>`` in the
SQL catalog, the ``assert-ref-snapshot-id`` requirement in a REST catalog):

* *Pinned*: the commit requires the branch ``main`` to still be at the
  snapshot the run read. Before committing, the table is loaded again and a
  newer snapshot is reported at once as a :class:`SinkError` naming it and its
  writer; a commit that loses the race all the same
  (``CommitFailedException``) is reported the same way. pgpoll's tables are
  created with ``commit.retry.num-retries=0``, so pyiceberg does not re-apply
  the run over another writer's snapshot.
* *Idempotent*: the snapshot summary carries ``pgpoll.position`` (the
  commit-log position the state reflects, an LSN), ``pgpoll.output`` and
  ``pgpoll.schema-id``; a run whose position is not newer than the pinned
  one's commits nothing (``--full`` commits anyway).
* *Readable*: the previous state is read with pyiceberg's own Arrow scan
  (field ids, schema evolution, row deletes of other engines applied).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pgpoll import faults
from pgpoll.errors import SinkError, first_line
from pgpoll.materialize.delta.table import DataFile
from pgpoll.materialize.iceberg.types import nullable_schema, refused_changes, type_changes

PREFIX = "pgpoll."
"""The prefix of pgpoll's properties in a snapshot summary."""
NO_RETRY = {"commit.retry.num-retries": "0"}
"""Set on the tables pgpoll creates: a lost commit is reported, never re-applied over another writer's snapshot."""
BEFORE_COMMIT = "materialize-before-commit"
AFTER_COMMIT = "materialize-after-commit"
_HISTORY = 100


def _properties(summary: Any) -> dict[str, str]:
    """A snapshot summary's properties besides the operation (pyiceberg's ``Summary.additional_properties``)."""
    return dict(getattr(summary, "additional_properties", None) or {})


def summary_meta(summary: Any) -> dict[str, str] | None:
    """pgpoll's properties of a snapshot summary, without the prefix (None: not written by pgpoll)."""
    if summary is None:
        return None
    found = {k[len(PREFIX):]: str(v) for k, v in _properties(summary).items() if k.startswith(PREFIX)}
    return found if "position" in found else None


def writer_of(snapshot: Any) -> str:
    """Who wrote ``snapshot``, as its summary says (pgpoll's run, or the engine and operation)."""
    summary = _properties(snapshot.summary)
    operation = getattr(snapshot.summary, "operation", None)
    meta = summary_meta(snapshot.summary)
    if meta is not None:
        return f"pgpoll run {meta.get('run', '?')}"
    engine = summary.get("engine-name") or summary.get("app-id") or "another writer"
    return f"{engine} ({getattr(operation, 'value', operation) or '?'})"


@dataclass(frozen=True)
class PinnedSnapshot:
    """What a run read of one Iceberg table: the snapshot it builds on (``snapshot_id`` None: no snapshot)."""

    identifier: tuple[str, str]
    table: Any = None
    """The pyiceberg ``Table`` as loaded (None: no table yet)."""
    snapshot_id: int | None = None
    meta: Mapping[str, str] | None = None
    """pgpoll's summary properties of the newest pgpoll snapshot among the pinned one and its ancestors."""
    tasks: Mapping[str, Any] = field(default_factory=dict)
    """The pinned snapshot's ``FileScanTask`` per data file path."""

    @property
    def has_row_deletes(self) -> bool:
        """True when another engine added delete files (pgpoll never does): such files are read, not kept."""
        return any(task.delete_files for task in self.tasks.values())

    def data_files(self) -> list[Any]:
        """The pinned snapshot's pyiceberg ``DataFile`` objects."""
        return [task.file for task in self.tasks.values()]

    def stats(self, key: Sequence[str]) -> tuple[DataFile, ...]:
        """The data files with their record counts and the key columns' bounds and null counts (as the
        Delta path's file choice takes them: :mod:`pgpoll.materialize.delta.files`)."""
        from pyiceberg.conversions import from_bytes

        schema = self.table.schema() if self.table is not None else None
        fields = {}
        for k in key:
            try:
                fields[k] = schema.find_field(k, case_sensitive=True) if schema is not None else None
            except ValueError:
                fields[k] = None
        out: list[DataFile] = []
        for path, task in self.tasks.items():
            f = task.file
            low: dict[str, Any] = {}
            high: dict[str, Any] = {}
            nulls: dict[str, int] = {}
            for k, fld in fields.items():
                if fld is None:
                    continue
                if f.null_value_counts and fld.field_id in f.null_value_counts:
                    nulls[k] = int(f.null_value_counts[fld.field_id])
                lo = (f.lower_bounds or {}).get(fld.field_id)
                hi = (f.upper_bounds or {}).get(fld.field_id)
                if lo is not None and hi is not None:
                    low[k], high[k] = from_bytes(fld.field_type, lo), from_bytes(fld.field_type, hi)
            out.append(DataFile(path, int(f.file_size_in_bytes), int(f.record_count), low, high, nulls))
        return tuple(out)


class IcebergStateTable:
    """One table of a catalog, written by pgpoll for the output ``output``."""

    def __init__(self, catalog: Any, identifier: tuple[str, str], output: str) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.output = output
        self.name = ".".join(identifier)

    def load(self) -> Any:
        """The table as the catalog has it now (None: no such table)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise SinkError(f"cannot load the Iceberg table {self.name}: {first_line(exc)}",
                            "check the catalog's settings and that it is reachable") from None

    def expire(self, retention_hours: float) -> dict[str, Any]:
        """Expire the snapshots older than ``retention_hours`` (never the current one: pyiceberg protects branch
        heads); what was done, for the summary (:mod:`pgpoll.materialize.maintenance`)."""
        from datetime import UTC, datetime, timedelta

        table = self.load()
        if table is None:
            return {"expired_snapshots": 0, "retention_hours": retention_hours}
        before = len(table.metadata.snapshots)
        cutoff = datetime.now(UTC) - timedelta(hours=retention_hours)
        current = table.metadata.current_snapshot_id
        if not any(s.timestamp_ms < cutoff.timestamp() * 1000 and s.snapshot_id != current for s in table.metadata.snapshots):
            return {"expired_snapshots": 0, "snapshots": before, "retention_hours": retention_hours}  # no commit
        table.maintenance.expire_snapshots().older_than(cutoff).commit()
        after = self.load()
        left = len(after.metadata.snapshots) if after is not None else before
        return {"expired_snapshots": before - left, "snapshots": left, "retention_hours": retention_hours}

    def pin(self) -> PinnedSnapshot:
        """The table's current snapshot, which this run builds on and commits after."""
        from pyiceberg.table.snapshots import ancestors_of

        table = self.load()
        if table is None:
            return PinnedSnapshot(self.identifier)
        current = table.current_snapshot()
        if current is None:
            return PinnedSnapshot(self.identifier, table)
        meta = None
        for n, snapshot in enumerate(ancestors_of(current, table.metadata)):
            meta = summary_meta(snapshot.summary)
            if meta is not None or n >= _HISTORY:
                break
        tasks = {task.file.file_path: task for task in table.scan(snapshot_id=current.snapshot_id).plan_files()}
        return PinnedSnapshot(self.identifier, table, current.snapshot_id, meta, tasks)

    def read(self, pinned: PinnedSnapshot, paths: Sequence[str] | None = None) -> pa.Table | None:
        """The rows of the pinned snapshot's files ``paths`` (None: every file), with pyiceberg's Arrow scan
        projected on the table's schema (None: no table)."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        if pinned.table is None:
            return None
        chosen = list(pinned.tasks.values()) if paths is None else [pinned.tasks[p] for p in paths]
        metadata = pinned.table.metadata
        return ArrowScan(metadata, pinned.table.io, metadata.schema(), AlwaysTrue()).to_table(chosen)

    def conflict(self, pinned: PinnedSnapshot, now: Any) -> SinkError:
        """The error for a snapshot another writer committed after ``pinned`` was read."""
        current = now.current_snapshot() if now is not None else None
        read = "no table" if pinned.table is None else (
            "a table without snapshots" if pinned.snapshot_id is None else f"snapshot {pinned.snapshot_id}")
        what = (f"snapshot {current.snapshot_id} was committed by {writer_of(current)}" if current is not None
                else "the table was created by another writer")
        return SinkError(
            f"Iceberg table {self.name}: {what} after this run read {read}; not committed over it",
            "find out who else writes this table (one writer at a time); then rerun pgpoll materialize, "
            "which builds on the newest snapshot",
        )

    def applied(self, pinned: PinnedSnapshot, position: int) -> bool:
        """Whether the pinned snapshot already reflects ``position`` of this output."""
        from pgpoll.lsn import Lsn

        meta = pinned.meta
        if meta is None or meta.get("output") != self.output:
            return False
        try:
            return int(Lsn.parse(meta["position"])) >= position
        except (KeyError, ValueError):
            return False

    def commit(self, pinned: PinnedSnapshot, schema: pa.Schema, write: Callable[[Any, Any], list[Any]],
               replaces: Sequence[Any] | None, properties: Mapping[str, str], position: int, *,
               force: bool = False) -> tuple[int | None, list[Any]]:
        """Commit the state as one snapshot on ``pinned``; returns its id and the data files added (None and []
        when ``position`` was already applied and not ``force``).

        ``schema`` is the state's Arrow schema; ``write(table_metadata, io)``
        writes the data files (for the metadata the snapshot will have, so
        new columns have their ids) and returns them; ``replaces`` are the
        pinned files they replace (None: every file). ``properties`` go into
        the snapshot summary under ``pgpoll.`` (with ``output``, this
        table's output path: a position is one output's). Raises :class:`SinkError` when
        another writer committed after ``pinned`` or a type change is one
        Iceberg does not allow.
        """
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError, ValidationException

        now = self.load()
        now_id = None if now is None or now.current_snapshot() is None else now.current_snapshot().snapshot_id
        if (now is None) != (pinned.table is None) or now_id != pinned.snapshot_id:
            raise self.conflict(pinned, now)
        if not force and self.applied(pinned, position):
            return None, []
        tx = self._transaction(pinned, schema)
        io = pinned.table.io if pinned.table is not None else self._io(tx.table_metadata)
        added = write(tx.table_metadata, io)
        faults.crash_if(BEFORE_COMMIT)  # (tests: killed with its data files written, before the catalog commit)
        removed = pinned.data_files() if replaces is None else list(replaces)
        summary = {PREFIX + k: str(v) for k, v in {**properties, "output": self.output}.items()}
        try:
            with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
                for f in removed:
                    overwrite.delete_data_file(f)
                for f in added:
                    overwrite.append_data_file(f)
            committed = tx.commit_transaction()
        except (CommitFailedException, TableAlreadyExistsError, ValidationException):
            self._delete(io, added)
            raise self.conflict(pinned, self.load()) from None
        except SinkError:
            self._delete(io, added)
            raise
        except Exception as exc:  # the outcome is unknown: the files may be in the table now, keep them
            raise SinkError(f"cannot commit to the Iceberg table {self.name}: {first_line(exc)}",
                            "check the catalog; the next run builds on whatever snapshot is current") from None
        faults.crash_if(AFTER_COMMIT)
        snapshot = committed.current_snapshot()
        return (int(snapshot.snapshot_id) if snapshot is not None else None), added

    def _transaction(self, pinned: PinnedSnapshot, schema: pa.Schema) -> Any:
        """A transaction on the pinned table (or creating the table) with the state's schema applied."""
        wanted = nullable_schema(schema)
        if pinned.table is None:
            self._namespace()
            return self.catalog.create_table_transaction(self.identifier, schema=wanted, properties=NO_RETRY)
        current = pinned.table.schema()
        refused = refused_changes(type_changes(current, schema))
        if refused:
            listed = ", ".join(f"{c.column} {c.old} -> {c.new}" for c in refused)
            raise SinkError(
                f"Iceberg table {self.name}: the source changed column types in a way Iceberg cannot promote "
                f"({listed}); nothing committed",
                f"drop the table in the catalog (pyiceberg: catalog.drop_table({self.identifier!r})) and rerun "
                "pgpoll materialize --full to rebuild it, or materialize into another catalog or --to; Iceberg "
                "promotes only int to long, float to double and decimal(p,s) to a larger p",
            )
        tx = pinned.table.transaction()
        dropped = [f.name for f in current.fields if f.name not in schema.names]
        names = {f.name for f in current.fields}
        if dropped or any(n not in names for n in schema.names) or type_changes(current, schema):
            with tx.update_schema() as update:
                update.union_by_name(wanted)
                for name in dropped:
                    update.delete_column(name)
        return tx

    def _namespace(self) -> None:
        """Create the table's namespace unless it exists (tables of one schema are committed at once: one wins)."""
        namespace = self.identifier[:1]
        try:
            self.catalog.create_namespace_if_not_exists(namespace)
        except Exception:  # (NamespaceAlreadyExistsError, or the SQL catalog's unique-key error)
            if not self.catalog.namespace_exists(namespace):
                raise

    def _io(self, metadata: Any) -> Any:
        from pyiceberg.io import load_file_io

        return load_file_io({**self.catalog.properties, **metadata.properties}, metadata.location)

    @staticmethod
    def _delete(io: Any, files: Sequence[Any]) -> None:
        for f in files:
            try:
                io.delete(f.file_path)
            except Exception:  # (a file left behind is in no snapshot: readers never see it)
                continue


def write_parquet_files(metadata: Any, io: Any, paths: Sequence[str], schema: pa.Schema) -> list[Any]:
    """Write the rows of the local Parquet files ``paths`` (Spark's output, each at most one file's rows) as one
    data file each, cast to the state's Arrow ``schema``; one file in memory at a time."""
    import pyarrow.parquet as pq

    out: list[Any] = []
    for path in paths:
        rows = pq.read_table(path)
        cast = pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in schema], schema=schema)
        out += write_data_files(metadata, io, cast, max(cast.num_rows, 1))
    return out


def write_data_files(metadata: Any, io: Any, table: pa.Table, rows_per_file: int) -> list[Any]:
    """Write ``table`` (columns named as the Iceberg schema's) into the table's data directory, in files of at
    most ``rows_per_file`` rows in order, with pyiceberg's writer (field ids and statistics); returns the
    pyiceberg ``DataFile`` objects."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema, write_file
    from pyiceberg.table import WriteTask

    if table.num_rows == 0:
        return []
    task_schema = pyarrow_to_schema(table.schema, name_mapping=metadata.schema().name_mapping,
                                    format_version=metadata.format_version)
    run = uuid.uuid4()
    tasks = iter([
        WriteTask(write_uuid=run, task_id=n, schema=task_schema, record_batches=table.slice(start, rows_per_file).to_batches())
        for n, start in enumerate(range(0, table.num_rows, rows_per_file))
    ])
    return list(write_file(io, metadata, tasks))
