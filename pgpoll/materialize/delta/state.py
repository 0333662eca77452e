"""``pgpoll materialize --format delta``: each table's current state as its own Delta table.

The state is computed exactly as for ``--format parquet``
(:class:`pgpoll.materialize.run.Materializer`); only where it is read from
and how it is published differ:

* the previous state is the files of the table version this run read (and
  pinned), the commit-log position it reflects is the version of pgpoll's
  application transaction in that version, and its schema id is in pgpoll's
  object of the commit's ``commitInfo``;
* Spark writes the new state's Parquet files into the table's directory
  (``DEST/<schema>.<table>/pgpoll-<run>/``), range-partitioned and sorted on
  the key in files of bounded size, pgpoll takes per-file statistics
  (record count; min, max and null count of the key columns when they are
  integers, strings or dates) from their footers (or one pass over them),
  and delta-rs commits them as one version that replaces the pinned one's
  files (:mod:`pgpoll.materialize.delta.table`);
* an incremental run reads and rewrites only the pinned files that may hold
  a key the new changes touch, when that is exact, and keeps the others
  (:mod:`pgpoll.materialize.delta.files`); ``materialize --json`` says how
  many files were rewritten, added and kept.

Files of a run that died before its commit are in no version: readers never
see them, and ``DeltaTable.vacuum()`` removes them with the files that older
versions no longer need. A run whose commit loses to another writer removes
its own files and fails (exit 5).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from pgpoll.errors import ConfigError, SinkError, first_line
from pgpoll.lsn import Lsn
from pgpoll.materialize.change_summary import identity_segments, replay_key
from pgpoll.materialize.delta import files as delta_files
from pgpoll.materialize.delta.files import TARGET_ROWS, PartialPlan, laid_out, refusal, scan_changes, schema_shape, write_options
from pgpoll.materialize.delta.names import delta_schema_names, encode_arrow_schema, logical_stats, physical_names
from pgpoll.materialize.delta.table import DataFile, DeltaStateTable, PinnedVersion, app_id, delta_uri, footer_files
from pgpoll.materialize.driver.files import comparable_key, touched_files
from pgpoll.materialize.driver.run import arrow_stat_columns, read_parquet_files, sorted_on, write_state_file
from pgpoll.materialize.driver.state import (
    DRIVER_AFFECTED_BYTES,
    DRIVER_AFFECTED_ROWS,
    DRIVER_BYTES,
    DRIVER_ROWS,
    same_type,
    touched_key_values,
)
from pgpoll.materialize.maintenance import due
from pgpoll.materialize.run import STATE_FILE, MaterializeOptions, Materializer, TableState, _align
from pgpoll.materialize.state import StateColumn
from pgpoll.materialize.task_files import write_frame
from pgpoll.sink import layout
from pgpoll.sink.change_table import delta_location
from pgpoll.sink.commit.history import History
from pgpoll.sink.stores.filesystem import local_path
from pgpoll.typed.rows import quote

log = logging.getLogger("pgpoll.materialize")
RUN_DIR_PREFIX = "pgpoll-"


def nullable(data_type: Any) -> Any:
    """``data_type`` with every field, element and value nullable (the Delta schema pgpoll declares)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(nullable(data_type.keyType), nullable(data_type.valueType), True)
    return data_type


def arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema of a state frame, as the Delta schema is made from (timestamps in UTC, microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(nullable(spark_schema), timezone="UTC")


def _stat_columns(spark_schema: Any, key: list[str]) -> list[str]:
    """The key columns whose min and max Delta readers compare like Spark does (integers, strings, dates)."""
    from pyspark.sql.types import ByteType, DateType, IntegerType, LongType, ShortType, StringType

    kinds = (ByteType, ShortType, IntegerType, LongType, StringType, DateType)
    types = {f.name: f.dataType for f in spark_schema.fields}
    return [k for k in key if isinstance(types.get(k), kinds)]


@dataclass
class DeltaTableState(TableState):
    """What a ``--format delta`` run did for one table, with the files its commit rewrote, added and kept."""

    files: dict[str, int] | None = None

    def to_json(self) -> str:
        """One line of JSON (``files`` only when a version was committed)."""
        out = json.loads(super().to_json())
        if self.files is None:
            del out["files"]
        return json.dumps(out, sort_keys=True)


class DeltaMaterializer(Materializer):
    """Materializes the typed tables of one output path as Delta tables (see the module docstring)."""

    publishes_by_rename = False  # one Delta commit per table: works on object stores

    def __init__(self, spark: Any, opts: MaterializeOptions, stop: Any = None) -> None:
        super().__init__(spark, opts, stop)
        self.run_id = uuid.uuid4().hex[:12]
        self.app = app_id(self.dest.root)
        self._pins: dict[str, PinnedVersion] = {}
        self._versions: dict[str, int | None] = {}
        self._plans: dict[str, PartialPlan] = {}
        self._files: dict[str, dict[str, int]] = {}
        self._names: dict[str, dict[str, str]] = {}  # per table: physical column name -> PostgreSQL name
        self._changes: dict[str, int] = {}  # changes an incremental run applies (bounds the rows it may add)

    def delta_table(self, name: str) -> DeltaStateTable:
        """The Delta log of the table directory ``name`` under DEST."""
        found = delta_location(self.dest, name)
        if found is None:
            return DeltaStateTable(delta_uri(self.dest.path(name)), self.app)
        return DeltaStateTable(found[0], self.app, found[1])

    def _table(self, name: str, parsed: tuple[str, str], history: History) -> TableState:
        state = super()._table(name, parsed, history)
        before = self._pins[name].version if name in self._pins else None  # the version this run read
        state.format = "delta"
        state.version = self._versions.get(name)
        retention = self.opts.state_retention_hours
        if retention is not None and state.version is not None and due(before, state.version):
            try:  # under the destination lease: the only writer of this table now
                state.maintenance = self.delta_table(name).maintain(retention)
            except Exception as exc:  # the state is committed; maintenance is retried at the next crossing
                state.warnings.append(f"{state.table}: maintenance failed ({first_line(exc)}); fix: check the "
                                      "destination, or turn it off with --state-retention off")
        return DeltaTableState(**{f.name: getattr(state, f.name) for f in fields(state)}, files=self._files.get(name))

    def _read_marker(self, name: str) -> dict[str, Any] | None:
        target = self.dest.path(name)
        if self.dest.exists(self.dest.path(name, STATE_FILE)):
            raise ConfigError(f"{target} holds a Parquet state (written with --format parquet)",
                              "materialize with --format parquet, or into another --to DEST")
        pinned = self.delta_table(name).pin()
        names = self._names[name] = delta_schema_names(pinned.table.schema().to_json()) if pinned.table is not None else {}
        pinned = self._pins[name] = replace(pinned, stats=logical_stats(pinned.stats, names))
        self._versions[name] = pinned.version
        if pinned.version is None:
            return None
        if not pinned.readable:
            raise SinkError(
                f"{pinned.uri}: version {pinned.version} needs reader features pgpoll does not read "
                f"({', '.join(sorted(pinned.reader_features))})",
                "materialize into another --to DEST (pgpoll reads its own tables' files directly)",
            )
        meta = pinned.meta or {}
        if self.opts.full or pinned.applied is None or not pinned.files or not isinstance(meta.get("schema_id"), str):
            return None  # a full rebuild, committed over the pinned version
        return {"position": str(Lsn(pinned.applied)), "rows": int(meta.get("rows", 0)), "schema_id": meta["schema_id"],
                "snapshot_id": meta.get("snapshot_id"), "snapshot_rechecks_pending": meta.get("snapshot_rechecks_pending")}

    def _read_files(self, name: str, files: Sequence[str]) -> Any:
        paths = [f if "://" in f or f.startswith("/") else self.dest.path(name, f) for f in files]
        frame = self.read_parquet(self.dest, paths, files=True)
        names = self._names.get(name, {})  # columns stored under a %XX name (delta_names) get theirs back
        return frame.toDF(*[names.get(c, c) for c in frame.columns])

    def _read_previous(self, name: str, events: Any = None, key: Sequence[str] = (),
                       columns: Sequence[StateColumn] = ()) -> Any:
        """The pinned version's files; for an incremental run, when exact, only those ``events`` touch."""
        from pyspark.sql import functions as F

        pinned = self._pins[name]
        whole = self._read_files(name, pinned.files)
        self._plans.pop(name, None)
        why = "no new changes" if events is None else self._refusal(pinned, whole, key, columns)
        scan = None
        if why is None:
            scan = scan_changes(self.spark, events, columns, key, pinned.stats)
            self._changes[name] = scan.changes
            identity_changes = scan.shapes > 1 and len(identity_segments(self.summaries[name], self.store)) > 1
            why = "a TRUNCATE" if scan.truncated else "the replica identity changed" if identity_changes else None
        if why is not None or scan is None:
            log.info("%s: rewriting every file (%s)", name, why)
            return whole
        hit = scan.touched
        affected = tuple(f for f in pinned.stats if f.path in hit)
        kept = tuple(f for f in pinned.stats if f.path not in hit)

        def rest() -> Any:
            return _align(self._read_files(name, [f.path for f in kept]), list(columns))

        self._plans[name] = PartialPlan(affected, kept, tuple(schema_shape(whole.schema)), rest if kept else None)
        log.info("%s: rewriting %d of %d file(s)", name, len(affected), len(pinned.stats))
        return self._read_files(name, [f.path for f in affected]) if affected else whole.where(F.lit(False))

    def _refusal(self, pinned: PinnedVersion, whole: Any, key: Sequence[str], columns: Sequence[StateColumn]) -> str | None:
        """Why this incremental run rewrites every file, as far as the state tells (None: the changes decide;
        see delta_files)."""
        if not key:
            return "the table has no key"
        schema_id = (pinned.meta or {}).get("schema_id")
        previous_key = replay_key(self.store.load(schema_id)) if isinstance(schema_id, str) else []
        same = schema_shape(whole.schema) == schema_shape(_align(whole, list(columns)).schema)
        return refusal(pinned.stats, key, previous_key, truncated=False, identity_changes=False,
                       same_schema=same and _stat_columns(whole.schema, list(key)) == list(key))

    def _write(self, name: str, frame: Any, marker: dict[str, Any], key: list[str]) -> int:
        pinned = self._pins[name]
        plan = self._plans.pop(name, None)
        if plan is not None and tuple(schema_shape(frame.schema)) != plan.shape:
            log.info("%s: the new state's schema differs from the kept files'; rewriting every file", name)
            frame, plan = (frame if plan.rest is None else frame.unionByName(plan.rest())), None
        if plan is not None:  # the rewritten files' rows, and at most one more per change
            estimate: int | None = sum(f.records for f in plan.affected) + self._changes.get(name, 0)
        else:
            known = [f.records for f in pinned.stats]
            estimate = sum(known) if known and min(known) >= 0 else None
            bound = self.row_bounds.get(name)  # a first build: one file's worth of changes is one partition
            if not known and bound is not None and bound <= TARGET_ROWS:
                estimate = bound
        run_dir = f"{RUN_DIR_PREFIX}{self.run_id}"
        where = self.dest.path(name, run_dir)
        physical = physical_names(frame.columns)  # names Delta forbids, stored as %XX (delta_names)
        laid = laid_out(frame, key, estimate).toDF(*[physical[c] for c in frame.columns])
        stats = [physical[c] for c in _stat_columns(frame.schema, key)]
        written = None
        if self.dest.direct_writes:  # an object store: the tasks write with pyarrow (Spark has no connector there)
            written = write_frame(laid, self.dest, where, run_dir, TARGET_ROWS, stats, arrow_schema(laid.schema))
        else:
            laid.write.options(**write_options()).parquet(where)
        return self._commit_written(name, run_dir, marker, arrow_schema(frame.schema), stats, plan, written)

    def _write_arrow(self, name: str, table: Any, marker: dict[str, Any], key: list[str]) -> int:
        """:meth:`_write` for a state computed in the driver: sorted on the key, in files of at most
        :data:`TARGET_ROWS` rows written by pyarrow, replacing every file of the pinned version or, with a
        plan (:meth:`driver_previous`), the files it rewrites."""
        run_dir = f"{RUN_DIR_PREFIX}{self.run_id}"
        physical = physical_names(table.column_names)
        write_state_file(sorted_on(table, key).rename_columns([physical[c] for c in table.column_names]),
                         self.dest.path(name, run_dir), rows_per_file=delta_files.TARGET_ROWS, fs=self.dest)
        stats = [physical[c] for c in key if c in arrow_stat_columns(table.schema)]
        return self._commit_written(name, run_dir, marker, table.schema, stats, self._plans.pop(name, None))

    def _commit_written(self, name: str, run_dir: str, marker: dict[str, Any], schema: Any, stat_columns: list[str],
                        plan: PartialPlan | None, written: list[DataFile] | None = None) -> int:
        """Commit the files written under ``run_dir`` as the table's next version (``schema``: the state's
        Arrow schema; ``written``: the files and their statistics when the writer reported them); returns
        the state's rows. A failed commit removes them."""
        pinned = self._pins[name]
        where = self.dest.path(name, run_dir)
        try:
            files = written if written else self._data_files(where, run_dir, stat_columns)
            rows = sum(f.records for f in files) + (sum(f.records for f in plan.kept) if plan is not None else 0)
            meta = {**marker, "rows": rows, "run": self.run_id, "output": self.fs.root}
            version = self.delta_table(name).commit(pinned, files, encode_arrow_schema(schema),
                                                    int(Lsn.parse(marker["position"])), meta,
                                                    force=self.opts.full or name in self.rebuilt,
                                                    replaces=plan.affected if plan is not None else None)
        except BaseException:
            self._discard(name, where, run_dir)
            raise
        if version is None:
            log.info("%s: position %s was already applied; nothing committed", name, marker["position"])
            self.dest.delete(where)
            return int((pinned.meta or {}).get("rows", rows))
        self._versions[name] = version
        self._files[name] = (plan or PartialPlan(pinned.stats, ())).counts(len(files))
        return rows

    def driver_previous(self, name: str, events: Any, key: list[str], columns: list[StateColumn],
                        schema: Any) -> tuple[Any, str | None]:
        """The pinned version's rows the driver needs, as Arrow with the columns' PostgreSQL names: every file
        of a small table; of a large one, only the files that may hold a key the changes touch
        (:mod:`pgpoll.materialize.driver.files`; the others are kept by the commit); or why Spark does it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        pinned = self._pins[name]
        self._plans.pop(name, None)
        known = [f.records for f in pinned.stats]
        if self.engine == "driver" or (known and min(known) >= 0 and sum(known) <= DRIVER_ROWS
                                       and sum(f.size for f in pinned.stats) <= DRIVER_BYTES):
            return self._files_arrow(name, pinned.files), None
        if events is None:
            return None, "no new changes (a large Delta state)"
        meta = pinned.meta or {}
        previous_key = replay_key(self.store.load(meta["schema_id"])) if isinstance(meta.get("schema_id"), str) else []
        truncated = bool(pc.any(pc.equal(events.column("_op"), pa.scalar("T"))).as_py())
        same_schema = not pinned.stats or self._same_layout(name, pinned.stats[0].path, schema)
        # (the replica identity cannot have changed: driver_run leaves such changes to Spark)
        why = refusal(pinned.stats, key, previous_key, truncated=truncated, identity_changes=False, same_schema=same_schema)
        if why is None and not comparable_key(schema, key):
            why = "a key compared by Spark's rules (not an integer or a string)"
        touched = touched_files(pinned.stats, key, touched_key_values(events, columns, key)) if why is None else None
        if why is None and touched is None:
            why = "too many key comparisons"
        affected = tuple(f for f in pinned.stats if touched is not None and f.path in touched)
        if why is None and (sum(f.records for f in affected) > DRIVER_AFFECTED_ROWS
                            or sum(f.size for f in affected) > DRIVER_AFFECTED_BYTES):
            why = "the changes touch a large part of the state"
        if why is not None:
            return None, f"{why} (a large Delta state)"
        kept = tuple(f for f in pinned.stats if f not in affected)
        self._plans[name] = PartialPlan(affected, kept)
        log.info("%s: rewriting %d of %d file(s) in the driver", name, len(affected), len(pinned.stats))
        table = self._files_arrow(name, [f.path for f in affected])
        return (table if table is not None else schema.empty_table()), None

    def _file(self, name: str, path: str) -> str:
        """A file of the table's log as a path of DEST's filesystem (absolute, or relative to the table)."""
        return path if path.startswith("/") or "://" in path else self.dest.path(name, path)

    def _files_arrow(self, name: str, files: Sequence[str]) -> Any:
        """Files of the table read with pyarrow, with the columns' PostgreSQL names (None: no file)."""
        table = read_parquet_files([self._file(name, f) for f in files], self.dest)
        if table is None:
            return None
        names = self._names.get(name, {})
        return table.rename_columns([names.get(c, c) for c in table.column_names])

    def _same_layout(self, name: str, path: str, schema: Any) -> bool:
        """Whether a pinned file's columns are the new state's (files kept beside new ones must read alike)."""
        import pyarrow.parquet as pq

        stored = pq.read_schema(self.dest.arrow_path(self._file(name, path)), filesystem=self.dest.arrow())
        names = self._names.get(name, {})
        return [names.get(n, n) for n in stored.names] == schema.names and all(
            same_type(f.type, schema.field(names.get(f.name, f.name)).type) for f in stored)

    def _discard(self, name: str, where: str, run_dir: str) -> None:
        """Remove a failed run's files, unless its commit landed after all (then they are the table's)."""
        try:
            landed = self.delta_table(name).holds_files_under(run_dir)
        except Exception:  # cannot tell: keep them (vacuum removes them if they are in no version)
            return
        if not landed:
            self.dest.delete(where)

    def _run_tables(self, history: History, names: list[str]) -> list[TableState]:
        # delta-rs 1.6 decodes %XX in a table's location when it reads (not when it writes): refuse such paths
        selected = [n for n in names if (p := layout.parse_table_dir_name(n)) is not None and self.filter.accepts(*p)]
        odd = [n for n in selected if "%" in delta_uri(self.dest.path(n))]
        if odd:
            raise ConfigError(
                f"--format delta cannot write {', '.join(odd)} under {self.dest.root}: delta-rs cannot open a table "
                "location with '%' in it (pgpoll writes characters other than letters, digits, '_' and '-' in "
                "schema and table names as %XX)",
                "leave these tables out with --exclude-tables, choose a --to without '%', or use --format parquet",
            )
        return super()._run_tables(history, names)

    def _data_files(self, where: str, run_dir: str, stat_columns: list[str]) -> list[DataFile]:
        """The Parquet files Spark wrote under ``where``, with their sizes and statistics.

        Local destinations: from the files' footers (no data read); others: one Spark pass over the files.
        """
        from pyspark.sql import functions as F

        if local_path(where) is not None or self.dest.direct_writes:
            found = footer_files(where, run_dir, stat_columns, self.dest)
            if not found:
                raise SinkError(f"no Parquet file was written under {where}", "check the destination is writable")
            return found
        written = self.spark.read.parquet(where)
        aggs = [F.count(F.lit(1)).alias("n")]
        for i, c in enumerate(stat_columns):
            col = F.col(quote(c))
            aggs += [F.min(col).alias(f"lo{i}"), F.max(col).alias(f"hi{i}"),
                     F.sum(F.when(col.isNull(), 1).otherwise(0)).alias(f"nul{i}")]
        by_file = {
            str(r["f"]).rsplit("/", 1)[-1]: r
            for r in written.groupBy(F.input_file_name().alias("f")).agg(*aggs).collect()
        }
        out: list[DataFile] = []
        for file_name, is_dir, size in self.dest.list(where):
            if is_dir or not file_name.endswith(".parquet"):
                continue
            r = by_file.get(file_name)
            if r is None:
                out.append(DataFile(f"{run_dir}/{file_name}", size, 0))
                continue
            lo = {c: r[f"lo{i}"] for i, c in enumerate(stat_columns) if r[f"lo{i}"] is not None}
            hi = {c: r[f"hi{i}"] for i, c in enumerate(stat_columns) if r[f"hi{i}"] is not None}
            nulls = {c: int(r[f"nul{i}"]) for i, c in enumerate(stat_columns)}
            out.append(DataFile(f"{run_dir}/{file_name}", size, int(r["n"]), lo, hi, nulls))
        if not out:
            raise SinkError(f"Spark wrote no Parquet file under {where}", "check the destination is writable")
        return out
