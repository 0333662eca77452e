"""``format("pgpoll")``: the adapters between Spark's Python Data Source API and pgpoll (Spark's names stay here).

:class:`PgpollDataSource` picks the reader by the options
(:mod:`pgpoll.spark.source_options`): a stream or a preview of a slot, or a
batch read of an output. The adapters only translate: offsets and the slot's
movements are :mod:`pgpoll.spark.stream_offsets`, a task's read of the slot
:mod:`pgpoll.spark.slot_reads`, an output's files
:mod:`pgpoll.spark.output_reads`.

What Spark does with these classes (PySpark 4.3, ``pyspark/sql/datasource.py``,
``pyspark/sql/streaming/python_streaming_source_runner.py``): the stream
reader's ``initialOffset``, ``latestOffset``, ``partitions``, ``commit`` and
``prepareForTriggerAvailableNow`` run in one long-lived Python process on the
driver (one instance for the query's run, so it keeps its connection); ``read``
runs in a task on a *fresh* instance, so everything it needs travels in the
partition. A record batch ``read`` yields must equal the declared schema as
``pa.Schema.equals`` sees it (``records_to_arrow_batches`` in
``pyspark/sql/worker/plan_data_source_read.py``): every batch is conformed to
``to_arrow_schema`` of the schema Spark passes in. Partitions are pickled;
their ``repr`` never shows the DSN (``InputPartition``'s own shows all
attributes). A batch reader with no partition gets one ``InputPartition(None)``
to read (``plan_data_source_read.py``): it yields nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from pgpoll.errors import ConfigError
from pgpoll.sink.envelope import ENVELOPE_SCHEMA
from pgpoll.spark.output_files import conform
from pgpoll.spark.slot_reads import SlotRead, read_slot
from pgpoll.spark.source_options import SourceOptions, parse_options
from pgpoll.typed.schemas import TableSchema

__all__ = ["PgpollDataSource"]


def spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema of an Arrow one (timestamps without a time zone are ``timestamp_ntz``)."""
    return from_arrow_schema(pa.schema([pa.field(f.name, f.type) for f in arrow]), prefer_timestamp_ntz=True)


def exact_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks record batches against for ``schema``."""
    return to_arrow_schema(schema, timezone="UTC")


def _arrow_schema(opts: SourceOptions, shape: TableSchema | None) -> pa.Schema:
    if opts.reads_slot:
        if shape is not None:
            from pgpoll.spark.slot_typed import typed_schema

            return typed_schema(shape)
        return ENVELOPE_SCHEMA
    from pgpoll.spark.output_reads import plan_output

    return plan_output(opts)[0]


def _check_schema(given: StructType, opts: SourceOptions, shape: TableSchema | None) -> None:
    if given != spark_schema(_arrow_schema(opts, shape)):
        raise ConfigError("format pgpoll declares its own schema; a schema given with .schema(...) is not used",
                          "leave .schema(...) out; select or cast columns after loading")


class PartitionOf(InputPartition):
    """An input partition holding one picklable payload; its repr is the payload's (which hides secrets)."""

    def __init__(self, payload: Any) -> None:
        super().__init__(payload)
        self.payload = payload

    def __repr__(self) -> str:
        return f"PartitionOf({self.payload!r})"


class PgpollDataSource(DataSource):
    """``spark.read.format("pgpoll")`` and ``spark.readStream.format("pgpoll")``."""

    #: a slot's typed rows: the table's shape when the schema was declared (TableSchema JSON). Set by
    #: :meth:`schema`, it travels with this instance, which Spark pickles after asking for the schema
    #: (``pyspark/sql/worker/create_data_source.py``), to the readers on the driver and in the tasks.
    typed_shape: str | None = None

    @classmethod
    def name(cls) -> str:
        return "pgpoll"

    def _shape(self, opts: SourceOptions) -> TableSchema | None:
        if not (opts.reads_slot and opts.table is not None):
            return None
        if self.typed_shape is None:
            from pgpoll.spark.slot_typed import declared_shape

            self.typed_shape = declared_shape(opts).to_json()
        return TableSchema.from_json(self.typed_shape)

    def schema(self) -> StructType:
        opts = parse_options(self.options, streaming=None)
        return spark_schema(_arrow_schema(opts, self._shape(opts)))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_options(self.options, streaming=False)
        if opts.reads_slot:
            shape = self._shape(opts)
            _check_schema(schema, opts, shape)
            return SlotPreviewReader(opts, schema, shape)
        return OutputReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 (Spark's name)
        opts = parse_options(self.options, streaming=True)
        shape = self._shape(opts)
        _check_schema(schema, opts, shape)
        return SlotStreamReader(opts, schema, shape)


def _slot_read(opts: SourceOptions, plugin: str, options: list[str], start: int | None, end: int | None) -> SlotRead:
    from pgpoll.source.arrow_peek import requested_fetch

    assert opts.slot is not None
    return SlotRead(opts.dsn, opts.slot, plugin, tuple(options), start, end, opts.tables, requested_fetch())


def _read(payload: SlotRead, shape: TableSchema | None, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if shape is not None:
        from pgpoll.spark.slot_typed import read_slot_typed

        yield from read_slot_typed(payload, shape, schema)
        return
    for batch in read_slot(payload):
        yield conform(batch, schema)


class SlotPreviewReader(DataSourceReader):
    """``spark.read.format("pgpoll").option("slot", ...)``: what the slot holds now (a peek; the slot stays)."""

    def __init__(self, opts: SourceOptions, schema: StructType, shape: TableSchema | None) -> None:
        self.opts = opts
        self.shape = shape
        self.arrow = exact_arrow(schema)

    def partitions(self) -> Sequence[InputPartition]:
        from pgpoll.spark.stream_offsets import StreamOffsets

        offsets = StreamOffsets(self.opts)  # checks the slot, plugin and publications once, on the driver
        try:
            return [PartitionOf(_slot_read(self.opts, offsets.plugin, offsets.peek_options, None, None))]
        finally:
            offsets.stop()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PartitionOf):
            yield from _read(partition.payload, self.shape, self.arrow)


class OutputReader(DataSourceReader):
    """``spark.read.format("pgpoll").load(PATH)``: an output's committed change log, a typed table or a state."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        from pgpoll.spark.output_reads import plan_output

        self.opts = opts
        arrow, self.scans = plan_output(opts)
        if schema != spark_schema(arrow):
            raise ConfigError("format pgpoll declares its own schema, or the output changed since it was read",
                              "leave .schema(...) out, and load the output again")
        self.arrow = exact_arrow(schema)

    def partitions(self) -> Sequence[InputPartition]:
        return [PartitionOf(scan) for scan in self.scans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pgpoll.spark.output_reads import read_scan

        if isinstance(partition, PartitionOf):  # no partition: Spark reads one InputPartition(None) instead
            yield from read_scan(partition.payload, self.arrow)


class SlotStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pgpoll")``: the slot's change log, batch by batch, exactly once.

    Offsets, the slot's movements and admission control are
    :class:`pgpoll.spark.stream_offsets.StreamOffsets`; the option
    ``maxRowsPerTrigger`` is Spark's ``ReadMaxRows``, ``maxBytesPerTrigger``
    its ``ReadMaxBytes`` (when both are given, the one Spark passes is
    honoured with the other option beside it). A limit may be exceeded by
    one transaction, which passes whole, so a stream never stalls.
    """

    def __init__(self, opts: SourceOptions, schema: StructType, shape: TableSchema | None) -> None:
        from pgpoll.spark.stream_offsets import StreamOffsets

        self.opts = opts
        self.shape = shape
        self.arrow = exact_arrow(schema)
        self.offsets = StreamOffsets(opts)  # connects on first use: never in a task (read needs no connection here)

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's name)
        from pgpoll.spark.stream_offsets import offset_json

        return offset_json(self.offsets.initial(), initial=True)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.opts.max_rows is not None:
            return ReadMaxRows(self.opts.max_rows)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        from pgpoll.spark.stream_offsets import next_offset, offset_lsn

        max_rows, max_bytes = None, None
        if isinstance(limit, ReadMaxRows):
            max_rows, max_bytes = limit.max_rows, self.opts.max_bytes
        elif isinstance(limit, ReadMaxBytes):
            max_rows, max_bytes = self.opts.max_rows, limit.max_bytes
        return next_offset(start, self.offsets.latest(offset_lsn(start), max_rows, max_bytes))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.offsets.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        from pgpoll.spark.stream_offsets import batch_range

        first, last = batch_range(start, end)
        if last <= first:
            return []
        return [PartitionOf(_slot_read(self.opts, self.offsets.plugin, self.offsets.peek_options, first, last))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PartitionOf):
            yield from _read(partition.payload, self.shape, self.arrow)

    def commit(self, end: dict[str, Any]) -> None:
        from pgpoll.spark.stream_offsets import offset_lsn

        self.offsets.commit(offset_lsn(end))

    def stop(self) -> None:
        self.offsets.stop()
