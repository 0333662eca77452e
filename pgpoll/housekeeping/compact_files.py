"""The files of a merge: read in record order, written as one Parquet file per table, through the output's own store.

Rows keep the order they were committed in (each unit's files in turn), so a
merged file holds its records' rows exactly as the batches did, one after the
other; row groups are about :data:`ROW_GROUP_ROWS` rows however small the
batches were. The change log's files have one schema (the envelope); a typed
table's files gain columns as the table did (every partition carries every
column the table has had so far), so a merge is written in the union of its
units' schemas with the newest file's first, and older rows get nulls in
columns added after them, as a ``mergeSchema`` read shows them anyway.

Reads and writes go through :meth:`OutputFs.arrow` (pyarrow's local
filesystem, or obstore under a pyarrow filesystem for ``s3://``, ``gs://``,
``az://``): never a local-only call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.errors import SinkError, first_line
from pgpoll.housekeeping.compact_plan import Unit
from pgpoll.sink import layout
from pgpoll.sink.envelope import ENVELOPE_SCHEMA
from pgpoll.sink.parquet_writer import ENVELOPE_DICTIONARY, ENVELOPE_STATISTICS, WRITE_OPTIONS
from pgpoll.sink.stores.output_fs import OutputFs

ROW_GROUP_ROWS = 131072
"""Rows per row group of a merged file (the batches' own row groups are as small as the batches)."""


def unit_files(fs: OutputFs, unit: Unit, table: str | None) -> list[str]:
    """The paths of a unit's files of the change log (``table`` None) or of typed table ``table``, in order."""
    if unit.merge is not None:
        files = unit.merge.files if table is None else unit.merge.tables.get(table, {})
    else:
        assert unit.record is not None
        record = unit.record
        files = (dict(record.file_sizes) or {n: -1 for n in record.files}) if table is None \
            else dict(record.table_files.get(table, {}))
    base = fs.path(layout.CHANGES, unit.partition) if table is None else fs.path(layout.TABLES, table, unit.partition)
    return [f"{base}/{name}" for name in sorted(files)]


def _cast(column: Any, target: pa.DataType) -> Any:
    """``column`` as ``target``; structs field by field by name (``_before`` gains fields as its table does)."""
    if column.type.equals(target):
        return column
    if pa.types.is_struct(target) and pa.types.is_struct(column.type):
        have = {column.type.field(i).name for i in range(column.type.num_fields)}
        fields = [target.field(i) for i in range(target.num_fields)]
        children = [_cast(column.field(f.name), f.type) if f.name in have else pa.nulls(len(column), f.type)
                    for f in fields]
        return pa.StructArray.from_arrays(children, fields=fields, mask=column.is_null() if column.null_count else None)
    return column.cast(target)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as exactly ``schema``: columns by name, cast; absent ones null."""
    table = table.combine_chunks()
    arrays = []
    for target in schema:
        if target.name in table.column_names:
            arrays.append(_cast(table.column(target.name).chunk(0) if table.num_rows else
                                pa.array([], table.schema.field(target.name).type), target.type))
        else:
            arrays.append(pa.nulls(table.num_rows, target.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_merged(fs: OutputFs, sources: Sequence[str], target: str, table: str | None) -> tuple[int, int]:
    """Write the rows of ``sources`` (in order) into the one file ``target``; returns ``(rows, size)``."""
    arrow = fs.arrow()
    try:
        if table is None:  # the envelope: one schema, no footer to read first
            schema = ENVELOPE_SCHEMA
            options = dict(WRITE_OPTIONS, use_dictionary=ENVELOPE_DICTIONARY, write_statistics=ENVELOPE_STATISTICS)
        else:
            schemas = [pq.read_schema(arrow.open_input_file(fs.arrow_path(p))) for p in sources]
            schema = pa.unify_schemas(schemas[::-1], promote_options="permissive")  # the newest file's columns first
            options = dict(WRITE_OPTIONS)
        rows = waiting = 0
        pending: list[pa.Table] = []
        directory = target.rsplit("/", 1)[0]
        arrow.create_dir(fs.arrow_path(directory), recursive=True)
        with pq.ParquetWriter(fs.arrow_path(target), schema, filesystem=arrow, **options) as writer:
            for path in sources:
                pending.append(_conform(pq.ParquetFile(arrow.open_input_file(fs.arrow_path(path))).read(), schema))
                waiting += pending[-1].num_rows
                if waiting >= ROW_GROUP_ROWS:
                    merged = pa.concat_tables(pending)
                    writer.write_table(merged, row_group_size=ROW_GROUP_ROWS)
                    rows += merged.num_rows
                    pending.clear()
                    waiting = 0
            if pending:
                merged = pa.concat_tables(pending)
                writer.write_table(merged, row_group_size=ROW_GROUP_ROWS)
                rows += merged.num_rows
        size = int(arrow.get_file_info(fs.arrow_path(target)).size or 0)
    except (OSError, pa.ArrowInvalid) as exc:
        raise SinkError(f"cannot merge into {target}: {first_line(exc)}",
                        "check that the output is reachable and writable; rerun pgpoll compact (nothing was replaced)") from None
    except (pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:  # a column's type changed within the run
        raise SinkError(f"cannot merge {table or 'the change log'} into {target}: its files' columns do not unify "
                        f"({first_line(exc)})",
                        "nothing was replaced: pgpoll compact cannot yet merge batches across a change of a column's "
                        "type (docs/how-to/compact.md)") from None
    return rows, size


def delete_sources(fs: OutputFs, sources: Sequence[Sequence[Any]]) -> int:
    """Delete the partitions a merge replaced (``[partition, [typed table dirs]]``); returns how many were there."""
    deleted = 0
    for partition, tables in sources:
        for path in [fs.path(layout.CHANGES, str(partition))] + [fs.path(layout.TABLES, str(t), str(partition))
                                                                   for t in tables]:
            if fs.exists(path):
                fs.delete(path)
                deleted += 1
    return deleted
