"""The SQL that reads one chunk of a snapshot, and the parse of what it returns.

The chunks themselves are planned in :mod:`pgpoll.source.snapshot.plans`
(:class:`ChunkSpec`, :func:`plan_chunks`...; importable from here too): key
ranges of the replica-identity key, or ctid block ranges of a leaf.

The rows of a chunk come from ``COPY (SELECT ...) TO STDOUT (FORMAT
binary)`` (:func:`binary_copy_query`, read by ADBC) or ``(FORMAT csv)``
(:func:`copy_sql`, parsed by pyarrow into string columns: :func:`stream_csv`).
Statements are built as text with every identifier double-quoted and every
value a quoted literal: COPY takes no parameters. Key bounds are untyped
literals, which take each key column's own type in the row comparison.
:func:`written_since` is the recheck's condition (:mod:`pgpoll.snapshot.recheck`).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

from pgpoll.source.names import double_quote, sql_literal
from pgpoll.source.snapshot.catalog import SnapshotTable
from pgpoll.source.snapshot.plans import (
    MIN_CHUNK_ROWS,
    PROBE_TIMEOUT_MS,
    READ_BYTES_PER_S,
    ChunkSpec,
    chunk_rows_for,
    plan_chunks,
    relation_text,
    row_bytes,
    set_timeout,
)

__all__ = [
    "MIN_CHUNK_ROWS", "PROBE_TIMEOUT_MS", "READ_BYTES_PER_S", "STREAM_BLOCK_BYTES", "ChunkSpec", "binary_copy_query",
    "chunk_rows_for", "copy_sql", "parse_csv", "plan_chunks", "row_bytes", "set_timeout", "stream_csv", "written_since",
]


def _key_text(t: SnapshotTable) -> str:
    return "(" + ", ".join(double_quote(k) for k in t.key) + ")"


def _bound_text(values: tuple[Any, ...]) -> str:
    # untyped literals: each takes its key column's type (row comparison resolves per column)
    return "(" + ", ".join(sql_literal(str(v)) for v in values) + ")"


def _where(t: SnapshotTable, chunk: ChunkSpec, extra: tuple[str, ...] = ()) -> str:
    parts: list[str] = []
    if chunk.lo is not None:
        parts.append(f"{_key_text(t)} > {_bound_text(chunk.lo)}")
    if chunk.hi is not None:
        parts.append(f"{_key_text(t)} <= {_bound_text(chunk.hi)}")
    if chunk.blocks is not None:
        parts.append(f"ctid >= '({int(chunk.blocks[0])},0)'::tid")
        if chunk.blocks[1] is not None:
            parts.append(f"ctid < '({int(chunk.blocks[1])},0)'::tid")
    parts.extend(extra)
    if t.row_filter:
        parts.append(f"({t.row_filter})")  # the server's own text (pg_get_expr)
    return " AND ".join(parts) if parts else "true"


def copy_sql(t: SnapshotTable, chunk: ChunkSpec, extra: tuple[str, ...] = ()) -> str:
    """``COPY (SELECT cols FROM rel WHERE ...) TO STDOUT (FORMAT csv)`` for one chunk (no parameters)."""
    columns = ", ".join(double_quote(c.name) for c in t.columns)
    where = _where(t, chunk, extra)
    return f"COPY (SELECT {columns} FROM {relation_text(t, chunk.relation)} WHERE {where}) TO STDOUT WITH (FORMAT csv)"


#: Kinds whose cast to text is the type's output function (no pg_cast entry to text), read as ``col::text``;
#: other kinds not read natively go through ``format('%s', col)``, which always calls the output function.
_IO_TEXT_KINDS = frozenset({"numeric", "uuid", "json", "jsonb", "interval", "time", "timetz", "macaddr", "macaddr8"})


def _selected(name: str, kind: str, native: bool) -> str:
    col = double_quote(name)
    if native:
        return col
    if kind in _IO_TEXT_KINDS:
        return f"{col}::text AS {col}"
    return f"CASE WHEN {col} IS NULL THEN NULL ELSE pg_catalog.format('%s', {col}) END AS {col}"


def binary_copy_query(t: SnapshotTable, chunk: ChunkSpec, native: tuple[bool, ...], extra: tuple[str, ...] = ()) -> str:
    """The SELECT of one chunk read in binary (the driver runs it as ``COPY (...) TO STDOUT (FORMAT binary)``):
    ``native`` columns as they are, the others as the server's text of them (see the module docstring)."""
    columns = ", ".join(_selected(c.name, c.type.kind, nat) for c, nat in zip(t.columns, native, strict=True))
    return f"SELECT {columns} FROM {relation_text(t, chunk.relation)} WHERE {_where(t, chunk, extra)}"


def written_since(xid: int) -> str:
    """A condition true for every tuple written by transaction ``xid`` (full id) or a later one, subtransactions
    included (a subtransaction's id follows its parent's), in PostgreSQL's circular xid order.

    ``age(x)`` is the distance of ``x`` from the next transaction id, the same reference for every row of a
    statement; frozen and bootstrap ids are the oldest of all (``age`` gives them ``2^31 - 1``). The bound's
    ``age`` is a sub-select: ``age`` is only stable, so written inline it was computed again for every row (an
    InitPlan computes it once; measured: the recheck's scan of the 2M-row benchmark table 0.18 s of server CPU
    against 0.14 s).
    """
    return f"age(xmin) <= (SELECT age({sql_literal(str(xid & 0xFFFFFFFF))}::xid))"


def parse_csv(data: bytes | memoryview, names: tuple[str, ...]) -> pa.Table:
    """PostgreSQL CSV -> string columns: unquoted empty field = NULL, quoted ``""`` = ``''``; newlines in values."""
    schema = pa.schema([pa.field(n, pa.string()) for n in names])
    if len(data) == 0 or not names:
        return schema.empty_table()
    positional = [f"c{i}" for i in range(len(names))]
    table = pacsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),  # type: ignore[arg-type]  # a NativeFile; the stubs want IO; no copy
        read_options=pacsv.ReadOptions(column_names=positional, block_size=min(max(len(data) + 1, 1 << 20), 2**31 - 1)),
        parse_options=pacsv.ParseOptions(quote_char='"', double_quote=True, escape_char=False, newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={p: pa.string() for p in positional}, null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    return table.rename_columns(list(names)).cast(schema)


#: Bytes of COPY text per parsed batch: a chunk's memory is a few of these, whatever its row count.
STREAM_BLOCK_BYTES = 2 << 20


def stream_csv(copy: Callable[[BinaryIO], None], names: tuple[str, ...],
               block_bytes: int = STREAM_BLOCK_BYTES) -> Iterator[pa.RecordBatch]:
    """Run ``copy`` (which writes PostgreSQL CSV to the file it is given) and yield string batches as it goes.

    ``copy`` runs in a thread writing into a pipe that pyarrow's streaming CSV
    reader parses, so memory stays at a few blocks however long the chunk is.
    Null and quoting rules as :func:`parse_csv`. An error of ``copy`` is raised
    here, after the batches read so far.
    """
    schema = pa.schema([pa.field(n, pa.string()) for n in names])
    positional = [f"c{i}" for i in range(len(names))]
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        with os.fdopen(write_fd, "wb", buffering=1 << 20) as sink:
            try:
                copy(sink)
            except BaseException as exc:  # handed to the consumer
                failure.append(exc)

    producer = threading.Thread(target=produce, name="pgpoll-copy", daemon=True)
    producer.start()
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        try:
            head = source.read(1)
            if head and names:
                stream = pacsv.open_csv(
                    # buffered: each read returns the whole block asked for (a pipe gives short reads)
                    pa.PythonFile(io.BufferedReader(_Prefixed(head, source), 1 << 20), mode="r"),  # type: ignore[arg-type]
                    # one thread: a reader running ahead of the consumer would buffer the whole chunk
                    read_options=pacsv.ReadOptions(column_names=positional, block_size=block_bytes, use_threads=False),
                    parse_options=pacsv.ParseOptions(quote_char='"', double_quote=True, escape_char=False,
                                                     newlines_in_values=True),
                    convert_options=pacsv.ConvertOptions(
                        column_types={p: pa.string() for p in positional}, null_values=[""], strings_can_be_null=True,
                        quoted_strings_can_be_null=False,
                    ),
                )
                for batch in stream:
                    yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
            else:
                while source.read(1 << 16):
                    pass  # (no columns: drain)
        finally:
            while source.read(1 << 16):
                pass  # let the producer finish (an early exit of the consumer)
            producer.join()
    if failure:
        raise failure[0]


class _Prefixed(io.RawIOBase):
    """A raw reader: ``head`` first, then ``rest`` (the byte read to see whether COPY wrote anything)."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
