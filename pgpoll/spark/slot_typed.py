"""One table's typed rows read from a slot (``.option("table", "schema.table")`` with ``slot``).

The typed change rows of :mod:`pgpoll.typed.rows` (the table's own columns,
typed, and ``_op``, ``_commit_lsn``, ``_seq``...), as ``--typed-tables``
writes them, converted in the task by the same code
(:func:`pgpoll.sink.typed_columns.typed_columns_batch`).

A Spark query's schema is fixed when it starts, while a table's shape can
change under a running stream. The declared schema is the table's shape in
the catalog when the query was started (its columns, their types with
modifiers, its replica-identity key). Rows of an older shape read the
columns it lacks as null. A row with a column the declared shape does not
have (a column added after the start, a type changed since) cannot be
written under it: the task fails with a :class:`~pgpoll.errors.SourceError`
saying so; restarting the query declares the new shape. Rows written before
a type change cannot be read typed under the new one: read the change log
(the default columns) for those.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.errors import ConfigError, SourceError
from pgpoll.spark.output_files import conform
from pgpoll.spark.slot_reads import SlotRead, read_slot
from pgpoll.spark.source_options import SourceOptions
from pgpoll.typed.rows import ColumnLedger, TypedLayout
from pgpoll.typed.schemas import TableSchema, schema_from_columns

__all__ = ["declared_shape", "read_slot_typed", "typed_schema"]


def declared_shape(opts: SourceOptions) -> TableSchema:
    """The table's shape now, from the catalog (on the driver)."""
    from pgpoll.source.catalog import catalog_table
    from pgpoll.source.connection import connect, resolve_dsn

    assert opts.table is not None
    schema, table = opts.table
    conn = connect(resolve_dsn(opts.dsn or None), application_name="pgpoll spark (catalog)")
    try:
        found = catalog_table(conn, schema, table)
    finally:
        conn.close()
    if found is None or not found.base_types:
        raise ConfigError(f"table {schema}.{table} does not exist (or has no columns)",
                          'check .option("table", "schema.table"): names as PostgreSQL stores them')
    columns = [(name, full) for name, (_printed, full) in found.base_types.items()]
    return schema_from_columns(schema, table, columns, found)


def typed_schema(shape: TableSchema) -> pa.Schema:
    """The typed rows' Arrow schema for ``shape``."""
    return TypedLayout.build([shape], ColumnLedger()).arrow_schema()


def read_slot_typed(read: SlotRead, shape: TableSchema, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The typed rows of ``shape``'s table in ``read`` (runs on an executor), each batch exactly ``schema``."""
    from pgpoll.sink.typed_columns import typed_columns_batch

    registry: dict[str, Mapping[str, TableSchema]] = {}
    declared = set(schema.names)
    ledger = ColumnLedger()
    TypedLayout.build([shape], ledger)  # the declared columns keep their names: the ledger knows them first
    target = (pa.scalar(shape.schema, pa.string()), pa.scalar(shape.table, pa.string()))
    for batch in read_slot(read, on_schemas=lambda schemas: registry.update(live=schemas)):
        mine: Any = pc.and_(pc.equal(batch.column("schema_name"), target[0]), pc.equal(batch.column("table_name"), target[1]))
        rows = batch.filter(pc.fill_null(mine, False))
        if not rows.num_rows:
            continue
        seen = {sid for sid in pc.unique(rows.column("schema_id")).to_pylist() if sid is not None}
        shapes = [found for sid, found in registry.get("live", {}).items() if sid in seen]
        layout = TypedLayout.build([shape, *shapes], ledger)
        extra = [phys for phys, _name, _t in layout.columns if phys not in declared]
        if extra:
            raise SourceError(
                f"table {shape.schema}.{shape.table} has changed since the query started: column(s) "
                f"{', '.join(extra)} are not in its declared schema",
                "restart the query to read the table's current shape; rows from before a type change can only be read "
                "from the change log (leave the table option out)",
            )
        yield conform(typed_columns_batch(rows, layout), schema)
