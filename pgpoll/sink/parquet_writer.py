"""Writing a batch's Parquet files with pyarrow, from inside the batch task (the fast writer).

Spark's own writer behind ``mapInArrow`` converts every Arrow record batch
into Spark rows before writing them (the map columns cost most): about 10 s
per million envelope rows, where pyarrow writes the same batches in about 3 s.
So where the task can reach the output directly it writes the files itself:
on a local path or ``file:`` URI into the staging directory (the envelope
under ``plan.staging`` and, with ``--typed-tables``, each table's typed rows
under ``plan.tables_staging/<schema>.<table>/`` in the same pass:
:class:`pgpoll.sink.typed_tables.TypedTableWriters`); on an object store
(``s3:``, ``gs:``, ``az:``) into a local spill directory of its own, uploaded
to the final keys once the batch is complete (:mod:`pgpoll.sink.stores.uploads`).
Every other scheme (``hdfs:``, ``viewfs:``...) keeps Spark's writer;
``PGPOLL_WRITER=spark`` forces it where the output is local or Hadoop's,
``PGPOLL_WRITER=pyarrow`` refuses to fall back (an error for an output
pyarrow cannot reach).

The files are what Spark's writer produces, as far as any reader can tell:
``part-<n>-<uuid>-c000.snappy.parquet`` names (publishing moves ``part-*``
files), snappy compression, timestamps as ``TIMESTAMP(MICROS)`` — adjusted to
UTC for ``timestamp[us, tz=UTC]`` (timestamptz, commit times), not adjusted
for naive ones (timestamp without time zone) — and no ``lsn_range`` column
inside (a plain ``spark.read.parquet(PATH/changes)`` adds it from the
directory name). ``spark.read.parquet`` reads them with the envelope's
:data:`pgpoll.sink.envelope.SPARK_DDL` schema.

Memory stays bounded: each record batch goes to the open file as one row
group as soon as it arrives; nothing of the batch is kept. The writes run on
a :class:`WriterThread` with a queue of two, so Parquet encoding and the typed
conversion (Arrow compute, outside the GIL) overlap with decoding on a
second core.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pgpoll.errors import ConfigError
from pgpoll.sink.stores.config import is_store_url
from pgpoll.sink.stores.filesystem import local_path
from pgpoll.sink.stores.output_fs import OutputFs

WRITER_ENV = "PGPOLL_WRITER"
"""``auto`` (default: pyarrow where it reaches the output, else Spark), ``spark`` or ``pyarrow``."""

PYARROW = "pyarrow"
SPARK = "spark"

#: ParquetWriter settings shared by every file pgpoll writes with pyarrow.
WRITE_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "version": "2.6",  # TIMESTAMP(MICROS) with isAdjustedToUTC from the Arrow type; no INT96
    "coerce_timestamps": "us",
    "use_deprecated_int96_timestamps": False,
    "allow_truncated_timestamps": False,
}


#: The envelope's columns worth a dictionary (few distinct values). Its values and LSNs are nearly all
#: distinct: a dictionary there is built, outgrows its page and is thrown away (1M changes: 1.15 s and
#: 39 MB with every column tried, 0.72 s and 28 MB with these only).
ENVELOPE_DICTIONARY = [
    "op", "schema_name", "table_name", "before.key_value.key", "after.key_value.key",
    "unchanged_toast.list.element", "message_prefix", "transactional", "schema_id",
]


#: The envelope's columns with statistics: its scalars, which readers prune row groups and files with (the LSNs
#: above all). Min/max of the maps' keys and values prune nothing (Spark pushes no filter into a map) and were a
#: fifth of the envelope's encoding time (1M changes: 0.63 s with them, 0.50 s without).
ENVELOPE_STATISTICS = [
    "commit_lsn", "lsn", "seq", "xid", "commit_ts", "op", "schema_name", "table_name", "message_prefix",
    "transactional", "schema_id",
]


def choose_writer(staging: str, requested: str | None = None) -> str:
    """``"pyarrow"`` when the task can write ``staging`` itself (local path, ``file:`` URI), else ``"spark"``.

    ``requested`` (default: the ``PGPOLL_WRITER`` environment variable)
    ``spark`` forces Spark's writer; ``pyarrow`` refuses to fall back.
    """
    wanted = (requested if requested is not None else os.environ.get(WRITER_ENV, "auto")).strip().lower() or "auto"
    if wanted not in ("auto", PYARROW, SPARK):
        raise ConfigError(f"{WRITER_ENV}={wanted!r} is not a writer", f"set {WRITER_ENV} to auto, pyarrow or spark")
    if is_store_url(staging):
        return PYARROW  # (Spark has no Hadoop connector for the store: pgpoll writes there itself)
    if wanted == SPARK:
        return SPARK
    reachable = local_path(staging) is not None
    if wanted == PYARROW and not reachable:
        raise ConfigError(
            f"{WRITER_ENV}=pyarrow cannot write {staging} (pyarrow writes local paths and file: URIs only)",
            f"unset {WRITER_ENV} to let Spark's writer handle this output",
        )
    return PYARROW if reachable else SPARK


@dataclass(frozen=True)
class StagingTarget:
    """Where the task writes one batch; pickled to the executor with the batch spec.

    ``envelope`` and ``tables`` are local OS paths (the staging of a local
    output), or None with ``upload`` set: then the task writes into a spill
    directory of its own and uploads the files to ``fs`` under the plan
    ``upload`` (an object store: :mod:`pgpoll.sink.stores.uploads`). ``ledgers`` is
    the output's ``_pgpoll/tables/`` (column ledgers, read-only in the task),
    read through ``fs`` when given.
    """

    envelope: str | None  # plan.staging (None: spill, then upload)
    tables: str | None = None  # plan.tables_staging, when typed tables are written in the same pass
    ledgers: str | None = None  # the output's _pgpoll/tables/
    fs: OutputFs | None = None  # the output (ledgers are read and uploads go there)
    upload: str | None = None  # the plan's staging id, when the batch is uploaded

    @classmethod
    def of(cls, staging: str, tables_staging: str | None, ledgers: str | None) -> StagingTarget:
        """The target of a plan's staging URIs (local paths or ``file:`` URIs)."""
        envelope = local_path(staging)
        if envelope is None:
            raise ConfigError(f"{staging} is not a local path", f"unset {WRITER_ENV}")
        return cls(
            envelope,
            local_path(tables_staging) if tables_staging is not None else None,
            local_path(ledgers) if ledgers is not None else None,
        )

    @classmethod
    def uploaded(cls, fs: OutputFs, plan_id: str, ledgers: str) -> StagingTarget:
        """The target of a plan on an object store: spilled locally, uploaded under the plan's manifest."""
        return cls(None, None, ledgers, fs, plan_id)


def part_name(number: int) -> str:
    """A data file name like Spark's (``part-00000-<uuid>-c000.snappy.parquet``)."""
    return f"part-{number:05d}-{uuid.uuid4()}-c000.snappy.parquet"


class PartFiles:
    """``part-*`` Parquet files in one directory, one open at a time, written batch by batch.

    :meth:`open` starts a new file with a schema (a second call with another
    schema closes the current file first); :meth:`write` appends one record
    batch as a row group. :meth:`close` returns ``{file name: size}``.
    ``dictionary`` names the only columns to dictionary-encode, ``statistics`` the only ones with column
    statistics (default: all, for either).
    """

    def __init__(self, directory: str, fs: pafs.FileSystem | None = None, dictionary: list[str] | None = None,
                 statistics: list[str] | None = None) -> None:
        self.directory = directory
        self.fs = fs if fs is not None else pafs.LocalFileSystem()
        self._options = dict(WRITE_OPTIONS)
        if dictionary is not None:
            self._options["use_dictionary"] = dictionary
        if statistics is not None:
            self._options["write_statistics"] = statistics
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._names: list[str] = []
        self.rows = 0

    @property
    def schema(self) -> pa.Schema | None:
        """The open file's schema (None before the first :meth:`open`)."""
        return self._schema

    def opens_new(self, schema: pa.Schema) -> bool:
        """Whether :meth:`open` with ``schema`` starts a new file."""
        return self._writer is None or self._schema is None or not self._schema.equals(schema)

    def open(self, schema: pa.Schema, dictionary: list[str] | None = None) -> None:
        """Make sure a file with ``schema`` is open (a new file when the schema changed; ``dictionary``: the
        columns a new file dictionary-encodes, instead of the writer's own choice)."""
        if not self.opens_new(schema):
            return
        self._close_writer()
        if not self._names:
            self.fs.create_dir(self.directory, recursive=True)
        name = part_name(len(self._names))
        options = self._options if dictionary is None else dict(self._options, use_dictionary=dictionary)
        self._writer = pq.ParquetWriter(f"{self.directory}/{name}", schema, filesystem=self.fs, **options)
        self._schema = schema
        self._names.append(name)

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (its schema must be the open file's) as one row group."""
        if self._writer is None:
            self.open(batch.schema)
        assert self._writer is not None
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> dict[str, int]:
        """Finish the open file; ``{name: size}`` of every file written."""
        self._close_writer()
        return {name: self.fs.get_file_info(f"{self.directory}/{name}").size or 0 for name in self._names}

    def abort(self) -> None:
        """Close without caring about the files (the driver discards the staging)."""
        try:
            self._close_writer()
        except Exception:  # already failing; the staging is discarded
            self._writer = None


def clear_directory(directory: str, fs: pafs.FileSystem | None = None) -> None:
    """Remove ``directory`` and what is in it (an earlier attempt's files), if it exists."""
    fs = fs if fs is not None else pafs.LocalFileSystem()
    if fs.get_file_info(directory).type != pafs.FileType.NotFound:
        fs.delete_dir(directory)


class WriterThread:
    """Runs writes on one background thread, so Parquet encoding overlaps with decoding (pyarrow releases the GIL).

    At most ``depth`` writes wait in the queue (memory stays bounded: a few
    record batches). The first error of a write is raised by the next
    :meth:`submit` or by :meth:`finish`; later writes are skipped.
    """

    def __init__(self, depth: int = 2) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="pgpoll-parquet-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self._error is None:
                try:
                    job()
                except BaseException as exc:  # handed to the producer
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` (blocks while ``depth`` jobs wait); raises the error of an earlier job."""
        self._raise()
        self._queue.put(job)

    def finish(self) -> None:
        """Wait for every queued job; raises the first error."""
        self._queue.put(None)
        self._thread.join()
        self._raise()
