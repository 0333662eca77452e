"""Writing each table's typed changes beside the envelope, in the same batch (``--typed-tables``).

With the pyarrow writer (:mod:`pgpoll.sink.parquet_writer`) the batch task
writes them in the same pass as the envelope: :class:`TypedTableWriters`
turns each envelope record batch into every table's typed change rows
(:func:`pgpoll.sink.typed_columns.typed_columns_batch`, vectorised) as it passes; the driver then only
saves the changed column ledgers. With Spark's writer (the fallback for
stores pyarrow cannot reach), after the batch task has staged the envelope,
the driver runs one Spark job per table that changed: it reads that table's
staged envelope rows and turns them into typed change rows inside the Spark
task. Either way they land in ``<staging>-tables/<schema>.<table>/``. Publishing
moves them to ``tables/<schema>.<table>/lsn_range=<start>-<end>/`` together
with the envelope, under the same commit-log record, so both views always
hold the same changes.

Table shapes are stored once under ``_pgpoll/schemas/<id>.json`` and each
table's column ledger under ``_pgpoll/tables/<schema>.<table>.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.sink import layout
from pgpoll.sink.parquet_writer import PartFiles
from pgpoll.sink.stores.filesystem import OutputFs
from pgpoll.sink.typed_columns import typed_columns_batch
from pgpoll.typed.rows import ColumnLedger, TypedLayout, typed_batch
from pgpoll.typed.schemas import TableSchema


def tables_staging(staging: str) -> str:
    """Where the typed tables of the batch staged at ``staging`` are written."""
    return f"{staging}-tables"


class SchemaStore:
    """``_pgpoll/schemas/<id>.json``: table shapes by content id."""

    def __init__(self, fs: OutputFs) -> None:
        self.fs = fs
        self._cache: dict[str, TableSchema] = {}

    def save(self, schemas: Mapping[str, str]) -> dict[str, TableSchema]:
        """Store the shapes a batch reported (id -> JSON); returns them parsed."""
        out: dict[str, TableSchema] = {}
        for sid, text in schemas.items():
            described = TableSchema.from_json(text)
            path = self.fs.path(layout.SCHEMAS, f"{sid}.json")
            if sid not in self._cache and not self.fs.exists(path):
                self.fs.write_text(path, described.to_json())
            self._cache[sid] = out[sid] = described
        return out

    def load(self, sid: str) -> TableSchema:
        """The shape stored under ``sid``."""
        if sid not in self._cache:
            self._cache[sid] = TableSchema.from_json(self.fs.read_text(self.fs.path(layout.SCHEMAS, f"{sid}.json")))
        return self._cache[sid]


def load_ledger(fs: OutputFs, schema: str, table: str) -> ColumnLedger:
    """The table's column ledger (empty for a table not seen before)."""
    path = fs.path(layout.LEDGERS, f"{layout.table_dir_name(schema, table)}.json")
    return ColumnLedger.from_json(json.loads(fs.read_text(path))) if fs.exists(path) else ColumnLedger()


def _save_ledger(fs: OutputFs, schema: str, table: str, ledger: ColumnLedger) -> None:
    path = fs.path(layout.LEDGERS, f"{layout.table_dir_name(schema, table)}.json")
    fs.write_text(path, json.dumps(ledger.to_json(), sort_keys=True))
    ledger.changed = False


def _converter(typed: TypedLayout) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield typed_batch(batch, typed)

    return run


def stage_typed_tables(
    spark: Any, fs: OutputFs, staging: str, schemas: Mapping[str, TableSchema], outcome: Any = None,
) -> dict[str, list[tuple[str, int]]]:
    """Write the typed changes of every table in the staged batch; returns {table dir: [(file, size)]}.

    A table known only from a TRUNCATE and never seen with columns has no
    typed rows (its materialized state is empty anyway). When the batch task
    wrote them already (``outcome.typed_files`` is set: the pyarrow writer),
    only the ledgers it changed are saved.
    """
    in_task: Mapping[str, Mapping[str, int]] | None = getattr(outcome, "typed_files", None)
    if in_task is not None:
        save_ledgers(fs, outcome.ledgers)
        return {name: sorted(files.items()) for name, files in sorted(in_task.items())}
    from pyspark.sql import functions as F

    envelope = spark.read.parquet(staging)
    tables = {(s.schema, s.table) for s in schemas.values()}
    truncated = envelope.where(F.col("op") == "T").select("schema_name", "table_name").distinct().collect()
    tables |= {(r[0], r[1]) for r in truncated}
    written: dict[str, list[tuple[str, int]]] = {}
    for schema, table in sorted(tables):
        ledger = load_ledger(fs, schema, table)
        typed = TypedLayout.build([s for s in schemas.values() if (s.schema, s.table) == (schema, table)], ledger)
        if not typed.columns:
            continue
        if ledger.changed:
            _save_ledger(fs, schema, table, ledger)
        rows = envelope.where((F.col("schema_name") == schema) & (F.col("table_name") == table) & (F.col("op") != "M"))
        name = layout.table_dir_name(schema, table)
        target = f"{tables_staging(staging)}/{name}"
        rows.mapInArrow(_converter(typed), typed.spark_ddl()).write.mode("errorifexists").parquet(target)
        written[name] = [(n, size) for n, is_dir, size in fs.list(target) if not is_dir and n.startswith("part-")]
    return written


#: Typed-row columns with few distinct values in any batch (a batch's changes share few transactions).
TYPED_DICTIONARY = ["_op", "_commit_lsn", "_commit_ts", "_xid", "_schema_id", "_unchanged_toast.list.element",
                    "_untyped.key_value.key"]


#: The rows :func:`typed_dictionary` counts distinct values in (counting a whole batch's was a tenth of its typing).
_DICTIONARY_SAMPLE = 4096


def typed_dictionary(batch: pa.RecordBatch, typed: TypedLayout) -> list[str]:
    """The columns of a new typed file worth a dictionary: the meta columns above, and the table's columns
    with at most one distinct value in two rows of ``batch``'s first :data:`_DICTIONARY_SAMPLE` rows. A
    dictionary for nearly distinct values (keys, names, amounts) is built, outgrows its page and is thrown
    away: time for nothing."""
    out = list(TYPED_DICTIONARY)
    batch = batch.slice(0, _DICTIONARY_SAMPLE)
    for physical, _name, _type in typed.columns:
        column = batch.column(physical)
        if pa.types.is_nested(column.type):  # (lists, intervals: left plain)
            continue
        if 2 * pc.count_distinct(column, mode="all").as_py() <= batch.num_rows:
            out += [physical, f"_before.{physical}"]
    return out


def _one_table(names: pa.Array[Any], tables: pa.Array[Any]) -> list[tuple[str, str]] | None:
    """``[(schema, table)]`` when every row is of the first row's table (the usual batch), else None."""
    first = (names[0].as_py(), tables[0].as_py())
    if first[0] is None or first[1] is None:
        return None
    same = pc.and_(pc.equal(names, pa.scalar(first[0])), pc.equal(tables, pa.scalar(first[1])))
    return [(str(first[0]), str(first[1]))] if pc.all(same).as_py() is True else None


class _TableWriter:
    """One table's typed rows in the batch being written: its ledger, layout and open file."""

    def __init__(self, directory: str, ledger: ColumnLedger) -> None:
        self.ledger = ledger
        self.sids: list[str] = []
        self.layout: TypedLayout | None = None
        self.files = PartFiles(directory)
        self.pending: list[pa.RecordBatch] = []  # TRUNCATE rows seen before the table had any column


class TypedTableWriters:
    """Each table's typed change rows, written as the envelope's record batches pass (one pass, no second job).

    ``schemas`` is the batch assembler's live registry (schema id ->
    :class:`TableSchema`, in order of discovery). A table's layout is built from
    the shapes seen so far and its ledger (read from ``ledgers``, the output's
    ``_pgpoll/tables/``); when a later shape adds a column, the table's next
    rows go to a new file with the wider schema (readers use ``mergeSchema``,
    as across partitions). Changed ledgers are returned by :meth:`close` for
    the driver to save; this class writes nothing outside ``directory``.
    """

    def __init__(self, directory: str, ledgers: str | None, schemas: Mapping[str, TableSchema],
                 fs: OutputFs | None = None) -> None:
        self.directory = directory
        self.ledgers = ledgers
        self.schemas = schemas
        self.fs = fs  # where ``ledgers`` is read (None: a local directory)
        self._tables: dict[tuple[str, str], _TableWriter] = {}

    def _ledger(self, name: str) -> ColumnLedger:
        """The table's ledger as the output holds it (empty for a table not seen before)."""
        if self.ledgers is None:
            return ColumnLedger()
        path = f"{self.ledgers}/{name}.json"
        if self.fs is not None:
            found = self.fs.read_tagged(path)
            return ColumnLedger.from_json(json.loads(found[0])) if found is not None else ColumnLedger()
        if not os.path.exists(path):
            return ColumnLedger()
        with open(path, encoding="utf-8") as handle:
            return ColumnLedger.from_json(json.load(handle))

    def _table(self, schema: str, table: str) -> _TableWriter:
        found = self._tables.get((schema, table))
        if found is None:
            name = layout.table_dir_name(schema, table)
            found = self._tables[(schema, table)] = _TableWriter(f"{self.directory}/{name}", self._ledger(name))
        return found

    def write(self, batch: pa.RecordBatch) -> None:
        """Write the typed rows of every table in one envelope record batch (messages have none)."""
        messages = pc.equal(batch.column("op"), pa.scalar("M"))
        rows = batch.filter(pc.invert(messages)) if pc.any(messages).as_py() else batch  # (a filter copies the maps)
        if not rows.num_rows:
            return
        names, tables = rows.column("schema_name"), rows.column("table_name")
        keys = _one_table(names, tables)
        if keys is None:
            pairs = pa.Table.from_arrays([names, tables], ["s", "t"]).group_by(["s", "t"]).aggregate([])
            keys = [(str(s), str(t)) for s, t in zip(pairs.column("s").to_pylist(), pairs.column("t").to_pylist(), strict=True)]
        for schema, table in keys:
            part = rows if len(keys) == 1 else rows.filter(
                pc.and_(pc.equal(names, pa.scalar(schema)), pc.equal(tables, pa.scalar(table)))
            )
            self._write_table(self._table(schema, table), part)

    def _write_table(self, out: _TableWriter, rows: pa.RecordBatch) -> None:
        seen = set(pc.unique(rows.column("schema_id")).to_pylist())
        new = [sid for sid in self.schemas if sid in seen and sid not in out.sids]
        if new or out.layout is None:
            out.sids.extend(new)
            out.layout = TypedLayout.build([self.schemas[sid] for sid in out.sids], out.ledger)
        if not out.layout.columns:
            out.pending.append(rows)  # a TRUNCATE of a table not seen with columns yet
            return
        typed = [typed_columns_batch(b, out.layout) for b in [*out.pending, rows]]
        out.pending.clear()
        schema = out.layout.arrow_schema()
        if out.files.opens_new(schema):
            out.files.open(schema, dictionary=typed_dictionary(typed[-1], out.layout))
        for batch in typed:
            out.files.write(batch)

    def close(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]]]:
        """Finish every file: ``({table dir: {file: size}}, {table dir: changed ledger JSON})``."""
        files: dict[str, dict[str, int]] = {}
        ledgers: dict[str, dict[str, Any]] = {}
        for (schema, table), out in self._tables.items():
            name = layout.table_dir_name(schema, table)
            written = out.files.close()
            if written:
                files[name] = written
            if out.ledger.changed:
                ledgers[name] = out.ledger.to_json()
        return files, ledgers

    def abort(self) -> None:
        """Close every file, ignoring errors (the batch is being discarded)."""
        for out in self._tables.values():
            out.files.abort()


def save_ledgers(fs: OutputFs, ledgers: Mapping[str, Mapping[str, Any]]) -> None:
    """Store the column ledgers a batch task changed (table dir name -> ledger JSON)."""
    for name, content in sorted(ledgers.items()):
        fs.write_text(fs.path(layout.LEDGERS, f"{name}.json"), json.dumps(content, sort_keys=True))
