"""A state's Parquet files written by Spark's tasks with pyarrow, where Spark's writer cannot reach (object stores).

Spark writes through Hadoop's filesystem, which has no object-store connector
here (nor on many clusters). The state frame, already laid out (range-
partitioned on its key and sorted within each partition:
:func:`pgpoll.materialize.delta.files.laid_out`), is handed to ``mapInArrow``:
each task writes its partition's rows, in order, into files of at most
``rows_per_file`` rows through pgpoll's own store client (pickled with the
job), and returns one row per file: its path, size, record count and the
null count, minimum and maximum of the statistics columns, computed from the
rows it wrote (what Delta's ``stats`` hold). Nothing else is read back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pgpoll.materialize.delta.table import DataFile
from pgpoll.sink.parquet_writer import WRITE_OPTIONS
from pgpoll.sink.stores.output_fs import OutputFs

RESULT_DDL = "path string, size long, records long, stats string"
_RESULT = pa.schema([pa.field(n, t) for n, t in (("path", pa.string()), ("size", pa.int64()),
                                                  ("records", pa.int64()), ("stats", pa.string()))])


def _stats(tables: Sequence[pa.Table], columns: Sequence[str]) -> dict[str, Any]:
    """``{"lo": {...}, "hi": {...}, "nulls": {...}}`` of ``columns`` over the rows of one file."""
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        parts = [t.column(name) for t in tables if name in t.column_names]
        if not parts:
            continue
        column = pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type)
        nulls[name] = int(column.null_count)
        if column.null_count < len(column):
            bounds = pc.min_max(column)
            lo[name], hi[name] = bounds["min"].as_py(), bounds["max"].as_py()
    return {"lo": lo, "hi": hi, "nulls": nulls}


def _writer(fs: OutputFs, directory: str, prefix: str, rows_per_file: int, stat_columns: Sequence[str],
            schema: pa.Schema) -> Any:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrow = fs.arrow()
        task = uuid.uuid4().hex[:12]
        written: list[dict[str, Any]] = []
        pending: list[pa.Table] = []
        rows = 0

        def flush() -> None:
            nonlocal rows
            if not pending:
                return
            table = pa.concat_tables(pending).cast(schema)
            name = f"part-{len(written):05d}-{task}-c000.snappy.parquet"
            path = f"{directory}/{name}"
            pq.write_table(table, fs.arrow_path(path), filesystem=arrow, **WRITE_OPTIONS)
            size = int(arrow.get_file_info(fs.arrow_path(path)).size or 0)
            written.append({"path": f"{prefix}/{name}", "size": size, "records": table.num_rows,
                            "stats": json.dumps(_stats([table], stat_columns), default=str)})
            pending.clear()
            rows = 0

        for batch in batches:
            start = 0
            while start < batch.num_rows:
                take = min(batch.num_rows - start, rows_per_file - rows)
                pending.append(pa.Table.from_batches([batch.slice(start, take)]))
                rows += take
                start += take
                if rows >= rows_per_file:
                    flush()
        flush()
        if written:
            yield pa.RecordBatch.from_pylist(written, schema=_RESULT)

    return write


def write_frame(frame: Any, fs: OutputFs, directory: str, prefix: str, rows_per_file: int,
                stat_columns: Sequence[str], schema: pa.Schema) -> list[DataFile]:
    """Write ``frame`` (laid out) into ``directory`` of ``fs`` with pyarrow in its tasks; the files written,
    with paths ``prefix/<file>`` and their statistics."""
    rows = frame.mapInArrow(_writer(fs, directory, prefix, rows_per_file, list(stat_columns), schema), RESULT_DDL).collect()
    out: list[DataFile] = []
    for r in rows:
        stats = json.loads(r["stats"])
        out.append(DataFile(str(r["path"]), int(r["size"]), int(r["records"]), _typed(stats["lo"], schema),
                            _typed(stats["hi"], schema), {k: int(v) for k, v in stats["nulls"].items()}))
    return sorted(out, key=lambda f: f.path)


def _typed(values: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """Statistics back from JSON: dates as dates (the other stats columns are numbers and strings)."""
    import datetime

    out: dict[str, Any] = {}
    for name, value in values.items():
        field = schema.field(name) if name in schema.names else None
        if field is not None and pa.types.is_date32(field.type) and isinstance(value, str):
            out[name] = datetime.date.fromisoformat(value)
        else:
            out[name] = value
    return out
