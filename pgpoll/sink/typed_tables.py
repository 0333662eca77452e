"""Writing each table's typed changes beside the envelope, in the same batch (``--typed-tables``).

After the batch task has staged the envelope, the driver runs one Spark job
per table that changed: it reads that table's staged envelope rows and turns
them into typed change rows (:func:`pgpoll.typed.rows.typed_batch`, inside
the Spark task), written to ``<staging>-tables/<schema>.<table>/``. Publishing
moves them to ``tables/<schema>.<table>/lsn_range=<start>-<end>/`` together
with the envelope, under the same commit-log record, so both views always
hold the same changes.

Table shapes are stored once under ``_pgpoll/schemas/<id>.json`` and each
table's column ledger under ``_pgpoll/tables/<schema>.<table>.json``.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from pgpoll.sink import layout
from pgpoll.sink.filesystem import OutputFilesystem
from pgpoll.typed.rows import ColumnLedger, TypedLayout, typed_batch
from pgpoll.typed.schemas import TableSchema


def tables_staging(staging: str) -> str:
    """Where the typed tables of the batch staged at ``staging`` are written."""
    return f"{staging}-tables"


class SchemaStore:
    """``_pgpoll/schemas/<id>.json``: table shapes by content id."""

    def __init__(self, fs: OutputFilesystem) -> None:
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


def load_ledger(fs: OutputFilesystem, schema: str, table: str) -> ColumnLedger:
    """The table's column ledger (empty for a table not seen before)."""
    path = fs.path(layout.LEDGERS, f"{layout.table_dir_name(schema, table)}.json")
    return ColumnLedger.from_json(json.loads(fs.read_text(path))) if fs.exists(path) else ColumnLedger()


def _save_ledger(fs: OutputFilesystem, schema: str, table: str, ledger: ColumnLedger) -> None:
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
    spark: Any, fs: OutputFilesystem, staging: str, schemas: Mapping[str, TableSchema]
) -> dict[str, list[tuple[str, int]]]:
    """Write the typed changes of every table in the staged batch; returns {table dir: [(file, size)]}.

    A table known only from a TRUNCATE and never seen with columns has no
    typed rows (its materialized state is empty anyway).
    """
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
