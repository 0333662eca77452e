"""A Spark DataFrame over Parquet files that the tasks read with pyarrow: no Hadoop filesystem connector needed.

Spark reads ``s3a://``, ``gs://`` and ``abfss://`` only through Hadoop
connectors that Spark does not ship (and that cannot be installed where
there is no Maven). pgpoll's own client reaches every store it writes
(:class:`pgpoll.sink.stores.object_store.ObjectStoreOutputFs`), and it pickles: so a
frame over a list of files is a job whose tasks each open some of the files
with pyarrow through that client and yield their record batches
(``mapInArrow``). The same code reads local outputs, so a cluster with a
connector and one without behave alike.

Files whose columns differ (typed tables whose table gained columns) are
read as Spark's ``mergeSchema`` would: each batch is conformed to the
merged schema (missing columns null, the same type otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.sink.stores.output_fs import OutputFs

FILES_PER_TASK = 4


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns (absent ones null), cast where the types differ."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        columns.append(column if column.type.equals(field.type) else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _reader(fs: OutputFs, files: Sequence[str], schema: pa.Schema, constants: Sequence[dict[str, Any]] | None,
            ) -> Any:
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrow = fs.arrow()
        for batch in batches:
            for value in batch.column(0).to_pylist():
                index = int(value or 0)
                extra = constants[index] if constants is not None else {}
                parquet = pq.ParquetFile(fs.arrow_path(files[index]), filesystem=arrow)
                for part in parquet.iter_batches(batch_size=65_536):
                    if extra:
                        for name, value in extra.items():
                            part = part.append_column(name, pa.array([value] * part.num_rows, schema.field(name).type))
                    yield conform(part, schema)

    return read


def files_frame(spark: Any, fs: OutputFs, files: Sequence[str], schema: pa.Schema,
                constants: Sequence[dict[str, Any]] | None = None) -> Any:
    """A DataFrame of ``files`` (paths of ``fs``) with ``schema``, read by the tasks with pyarrow.

    ``constants[i]`` adds columns with one value to file ``i``'s rows (the
    ``lsn_range`` partition column, as a Hive-partitioned read adds it).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    spark_schema = from_arrow_schema(schema)
    if not files:
        return spark.createDataFrame([], spark_schema)
    tasks = max(1, min(len(files), (len(files) + FILES_PER_TASK - 1) // FILES_PER_TASK,
                       int(spark.sparkContext.defaultParallelism) * 4))
    indexes = spark.createDataFrame([(i,) for i in range(len(files))], "i int").repartition(tasks)
    return indexes.mapInArrow(_reader(fs, list(files), schema, constants), spark_schema)


def merged_schema(fs: OutputFs, files: Sequence[str]) -> pa.Schema:
    """The schemas of ``files``' footers merged in order (a column's first type wins), read in the driver."""
    arrow = fs.arrow()
    schemas = [pq.read_schema(fs.arrow_path(f), filesystem=arrow) for f in files]
    return pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
