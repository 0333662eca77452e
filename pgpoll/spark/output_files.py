"""How a Spark task reaches the files of a pgpoll output: one function, and the Arrow helpers around it.

Batch reads of an output (:mod:`pgpoll.spark.output_reads`) read Parquet
with pyarrow *inside the tasks*, not with ``spark.read.parquet``: outputs are
moving to object stores reached through obstore, where Spark has no Hadoop
connector. :func:`output_filesystem` is the one place that decides how a path
of an output is opened: pyarrow's local filesystem for local paths and
``file:`` URIs, and for ``s3://``, ``gs://`` and ``az://`` outputs the
output's own store client (:meth:`pgpoll.sink.stores.output_fs.OutputFs.arrow`,
obstore under a pyarrow filesystem), configured in each task from the same
``AWS_*``/``GOOGLE_*``/``AZURE_*`` variables as ``ingest``. Every read (driver
listings, footers, task reads) follows.

:func:`conform` makes a file's table exactly the declared schema (Spark
checks the first record batch against it with ``pa.Schema.equals``:
``string`` not ``large_string``, the time zone, nullability): columns by
name, cast to the declared type, absent ones null.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pgpoll.errors import SinkError, first_line
from pgpoll.sink.stores.config import is_store_url
from pgpoll.sink.stores.filesystem import local_path

__all__ = ["conform", "data_files", "file_schema", "open_parquet", "output_filesystem", "read_batches"]


def output_filesystem(output: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding ``output`` and the output's root path in it."""
    local = local_path(output)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local))
    if is_store_url(output):
        from pgpoll.sink.stores.filesystem import open_output

        fs = open_output(output)
        return fs.arrow(), fs.arrow_path(fs.root).rstrip("/")
    raise SinkError(
        f"pgpoll's Spark reader opens local paths, file: URIs and s3://, gs://, az:// outputs, not {output}",
        "read it with pgpoll.reader.read_changes(spark, PATH), or give the output's store URL",
    )


def _is_data(name: str) -> bool:
    return not name.startswith(("_", ".")) and name.endswith(".parquet")


def data_files(fs: pafs.FileSystem, directory: str) -> list[tuple[str, int]]:
    """``(path, size)`` of the Parquet files directly in ``directory`` (hidden names skipped), sorted; [] when absent."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError as exc:
        raise SinkError(f"cannot list {directory}: {first_line(exc)}", "check that the output is reachable") from None
    return sorted((i.path, int(i.size or 0)) for i in infos
                  if i.type == pafs.FileType.File and _is_data(os.path.basename(i.path)))


def file_schema(fs: pafs.FileSystem, path: str) -> pa.Schema:
    """A Parquet file's Arrow schema, from its footer."""
    try:
        with fs.open_input_file(path) as handle:
            return pq.read_schema(handle)
    except OSError as exc:
        raise SinkError(f"cannot read the footer of {path}: {first_line(exc)}", "check that the output is reachable") from None


def open_parquet(fs: pafs.FileSystem, path: str) -> pq.ParquetFile:
    """A Parquet file opened for reading (``FileNotFoundError`` when it is not there)."""
    return pq.ParquetFile(fs.open_input_file(path))


def read_batches(parquet: pq.ParquetFile, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of an open Parquet file (``columns`` only, those it has), in bounded memory."""
    names = set(parquet.schema_arrow.names)
    wanted = [c for c in columns if c in names] if columns is not None else None
    try:
        yield from parquet.iter_batches(batch_size=65536, columns=wanted)
    finally:
        parquet.close()


def _nulls(n: int, kind: pa.DataType) -> pa.Array[Any]:
    return pa.nulls(n, kind)  # type: ignore[call-overload,no-any-return]  # pyarrow-stubs: one overload per type


def _cast(column: pa.Array[Any], target: pa.DataType, name: str) -> pa.Array[Any]:
    """``column`` as ``target``; structs field by field by name (a struct column gains fields as a table does)."""
    if column.type.equals(target):
        return column
    if pa.types.is_struct(target) and pa.types.is_struct(column.type):
        struct: Any = column
        have = [column.type.field(i).name for i in range(column.type.num_fields)]
        fields = [target.field(i) for i in range(target.num_fields)]
        children = [_cast(struct.field(f.name), f.type, f"{name}.{f.name}") if f.name in have
                    else _nulls(len(column), f.type) for f in fields]
        mask = column.is_null() if column.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(
            f"column {name} holds {column.type}, which does not read as {target}: {first_line(exc)}",
            "the files under this output disagree on the column's type; read the files with pyarrow to see which",
        ) from None


def conform(batch: pa.RecordBatch, schema: pa.Schema, extra: dict[str, pa.Array[Any]] | None = None) -> pa.RecordBatch:
    """``batch`` as exactly ``schema``: by name, cast; absent columns null; ``extra`` supplies columns by name."""
    extra = extra or {}
    names = batch.schema.names
    arrays: list[pa.Array[Any]] = []
    for target in schema:
        if target.name in extra:
            arrays.append(_cast(extra[target.name], target.type, target.name))
        elif target.name in names:
            arrays.append(_cast(batch.column(names.index(target.name)), target.type, target.name))
        else:
            arrays.append(_nulls(batch.num_rows, target.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
