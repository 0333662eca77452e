"""Batch reads of a pgpoll output: the committed change log, one table's typed changes, a materialized state.

Planned on the driver from what decides visibility, never from a listing of
data directories:

* **the change log** and **typed tables**: the commit log
  (:class:`pgpoll.sink.commit.log.CommitLog`: the newest checkpoint and the
  records after it). A staged batch, a losing run's files, a partition no
  record names are never read. A record's files are moved into place only
  after the record exists (:mod:`pgpoll.sink.commit.recovery`), and a run can die
  in between, so each file of a record newer than the checkpoint is looked
  for where it ends up (``changes/<partition>/``) and, failing that, where
  it is moved from (the record's ``staging``); partitions folded into the
  checkpoint were moved before it was written, and are listed whole. On an
  output ``pgpoll compact`` merged, the change log is read through its Delta
  log and a typed table through the compaction map, which says which merged
  files hold which records' rows.
* **a Parquet state** (``materialize``): the table's directory, which
  ``materialize`` swaps in whole with a rename; **a Delta state**: the files
  of the table's current version (``DeltaTable.file_uris()``, the log's
  answer, read with pyarrow: Delta's jars are not needed; tables whose
  protocol needs reader features beyond ``timestampNtz`` are refused, as
  ``materialize`` refuses them).

Tasks read the files with pyarrow (:mod:`pgpoll.spark.output_files`), about
128 MB of Parquet each, and make every record batch exactly the declared
schema. The change log carries the ``lsn_range`` column as
:func:`pgpoll.reader.read_changes` does; ``afterLsn``/``uptoLsn`` keep
changes with ``afterLsn < commit_lsn <= uptoLsn`` (whole partitions outside
the range are not opened).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pgpoll.errors import ConfigError, SinkError
from pgpoll.sink import layout
from pgpoll.sink.envelope import ENVELOPE_SCHEMA
from pgpoll.spark.output_files import conform, data_files, file_schema, open_parquet, output_filesystem, read_batches
from pgpoll.spark.source_options import SourceOptions

__all__ = ["CHANGES", "CHANGES_SCHEMA", "STATE", "TYPED", "FileRef", "OutputScan", "plan_output", "read_scan"]

CHANGES, TYPED, STATE = "changes", "typed", "state"
CHANGES_SCHEMA = ENVELOPE_SCHEMA.append(pa.field("lsn_range", pa.string()))
"""The change log as an output read gives it: the envelope and its partition, as ``pgpoll.reader.read_changes``."""
TASK_BYTES = 128 << 20
_UNKNOWN_BYTES = 32 << 20  # a whole directory of unknown size counts as this much


@dataclass(frozen=True)
class FileRef:
    """One committed file: paths under the root where it may be (read the first that exists)."""

    candidates: tuple[str, ...]
    partition: str | None = None
    size: int = -1


@dataclass(frozen=True)
class DirRef:
    """Every data file of a directory under the root (a partition folded into a checkpoint, a Parquet state)."""

    directory: str
    partition: str | None = None


@dataclass(frozen=True)
class OutputScan:
    """One task's files; ``lsn_column`` is filtered to ``(after, upto]`` where given."""

    root: str
    kind: str
    refs: tuple[FileRef | DirRef, ...]
    after: int | None = None
    upto: int | None = None

    @property
    def lsn_column(self) -> str:
        return "commit_lsn" if self.kind == CHANGES else "_commit_lsn"


def _in_range(partition: str, opts: SourceOptions) -> bool:
    bounds = layout.parse_partition_name(partition)
    if bounds is None:
        return True
    first, last = bounds
    return not ((opts.after_lsn is not None and last <= opts.after_lsn) or (opts.upto_lsn is not None and first > opts.upto_lsn))


def _log_refs(opts: SourceOptions, table_dir: str | None) -> list[FileRef | DirRef]:
    """The committed files of the change log (``table_dir`` None) or of one typed table, in commit order."""
    from pgpoll.sink.commit.compactions import load_map
    from pgpoll.sink.commit.log import CommitLog
    from pgpoll.sink.stores.filesystem import open_output

    assert opts.path is not None
    fs = open_output(opts.path)
    compacted = load_map(fs)  # pgpoll compact's merges (empty: never compacted)
    if table_dir is None and (fs.direct_writes or compacted):  # the change table's log and the records after it
        from pgpoll.sink.change_table import committed_files

        found = committed_files(fs)
        # a batch just committed on a local output may still be moving from its staging: look there too
        moving: dict[str, str] = {} if fs.direct_writes else {
            r.partition: f"{layout.STAGING}/{r.staging}" for r in CommitLog(fs).state().tail if r.partition and r.staging}
        return [FileRef((f"{layout.CHANGES}/{partition}/{name}",)
                        + ((f"{moving[partition]}/{name}",) if partition in moving else ()), partition, size)
                for partition, name, size in found if _in_range(partition, opts)]
    commit_log = CommitLog(fs)
    state = commit_log.state()
    if compacted and table_dir is not None:
        return _compacted_refs(compacted, commit_log.records_after(0, state), table_dir, opts)
    refs: list[FileRef | DirRef] = []
    folded = commit_log.folded_partitions(state)
    for partition, tables in folded:
        if not _in_range(partition, opts) or (table_dir is not None and table_dir not in tables):
            continue
        where = f"{layout.CHANGES}/{partition}" if table_dir is None else f"{layout.TABLES}/{table_dir}/{partition}"
        refs.append(DirRef(where, partition))
    for record in state.tail:
        if not record.partition:
            continue
        partition = record.partition
        if not _in_range(partition, opts) or (table_dir is not None and table_dir not in record.tables):
            continue
        if table_dir is None:
            final, staged = f"{layout.CHANGES}/{partition}", f"{layout.STAGING}/{record.staging}"
            files = dict(record.file_sizes) or {name: -1 for name in record.files}
        else:
            final = f"{layout.TABLES}/{table_dir}/{partition}"
            staged = f"{layout.STAGING}/{record.staging}{layout.TABLES_SUFFIX}/{table_dir}"
            files = dict(record.table_files.get(table_dir, {}))
        if not files or record.staging is None:  # a version-1 record: its files were moved before it was written
            refs.append(DirRef(final, partition))
            continue
        refs.extend(FileRef((f"{final}/{name}", f"{staged}/{name}"), partition, size) for name, size in sorted(files.items()))
    return refs


def _compacted_refs(compacted: Any, records: list[Any], table_dir: str, opts: SourceOptions) -> list[FileRef | DirRef]:
    """A typed table's committed files on a compacted output: each record's own, or the merge now holding its rows
    (:meth:`pgpoll.sink.commit.compactions.CompactionMap.resolve`; the whole history is read, as a plain read lists it)."""
    refs: list[FileRef | DirRef] = []
    for piece in compacted.resolve(records, table_dir):
        if not _in_range(piece.partition, opts):
            continue
        final = f"{layout.TABLES}/{table_dir}/{piece.partition}"
        if not piece.files:  # a version-1 record: its files were moved before it was written
            refs.append(DirRef(final, piece.partition))
            continue
        refs.extend(FileRef((f"{final}/{name}",) + ((f"{piece.staging}/{name}",) if piece.staging else ()),
                            piece.partition, size) for name, size in sorted(piece.files.items()))
    return refs


def _paths(fs: pafs.FileSystem, base: str, ref: FileRef | DirRef) -> list[str]:
    """The data files ``ref`` stands for now (a committed file that is at neither place is an error)."""
    if isinstance(ref, DirRef):
        return [path for path, _size in data_files(fs, f"{base}/{ref.directory}" if ref.directory else base)]
    for _attempt in range(2):  # a move between the two looks: look again
        for candidate in ref.candidates:
            if fs.get_file_info(f"{base}/{candidate}").type == pafs.FileType.File:
                return [f"{base}/{candidate}"]
    raise SinkError(f"{base}/{ref.candidates[0]} is named by the commit log but is not in the output",
                    "restore the file from a backup; pgpoll cannot write the slot's old changes again")


def _union_schema(fs: pafs.FileSystem, base: str, refs: list[FileRef | DirRef], what: str) -> pa.Schema:
    paths = [p for ref in refs for p in _paths(fs, base, ref)]
    if not paths:
        raise ConfigError(f"{what} has no data files", "check the name, and that the output holds it")
    schemas = [file_schema(fs, p) for p in paths]
    try:
        unified = pa.unify_schemas(schemas)
    except pa.ArrowInvalid as exc:
        raise SinkError(f"the files of {what} disagree on their columns: {exc}", "read them one by one with pyarrow") from None
    return pa.schema([pa.field(f.name, f.type) for f in unified])  # nullable, no file metadata


def _group(root: str, kind: str, refs: list[FileRef | DirRef], opts: SourceOptions) -> list[OutputScan]:
    """Refs cut into tasks of about :data:`TASK_BYTES` each, in order."""
    scans: list[OutputScan] = []
    current: list[FileRef | DirRef] = []
    size = 0
    after = int(opts.after_lsn) if opts.after_lsn is not None else None
    upto = int(opts.upto_lsn) if opts.upto_lsn is not None else None
    for ref in refs:
        current.append(ref)
        size += ref.size if isinstance(ref, FileRef) and ref.size >= 0 else _UNKNOWN_BYTES
        if size >= TASK_BYTES:
            scans.append(OutputScan(root, kind, tuple(current), after, upto))
            current, size = [], 0
    if current:
        scans.append(OutputScan(root, kind, tuple(current), after, upto))
    return scans


def _state_refs(opts: SourceOptions) -> tuple[str, list[FileRef | DirRef], pa.Schema | None]:
    """The state's directory, its current files, and (an empty Delta table) the schema its log declares."""
    assert opts.state is not None and opts.path is not None
    dest = opts.state_dir or f"{opts.path.rstrip('/')}/{layout.STATE}"
    root = f"{dest.rstrip('/')}/{layout.table_dir_name(*opts.state)}"
    fs, base = output_filesystem(root)
    if fs.get_file_info(f"{base}/_delta_log").type == pafs.FileType.Directory:
        return root, *_delta_refs(root)
    if fs.get_file_info(base).type != pafs.FileType.Directory:
        raise ConfigError(f"no materialized state of {opts.state[0]}.{opts.state[1]} at {root}",
                          "run pgpoll materialize first, or pass the destination it wrote with .option(\"stateDir\", DEST)")
    return root, [DirRef("")], None


def _delta_refs(root: str) -> tuple[list[FileRef | DirRef], pa.Schema | None]:
    """The current version's files of the Delta table at ``root`` (the log says which), relative to it."""
    from pgpoll.materialize.delta.table import READABLE_READER_FEATURES
    from pgpoll.sink.delta_read import delta_files, open_delta
    from pgpoll.sink.stores.filesystem import open_output

    fs = open_output(root)
    table = open_delta(fs)
    protocol = table.protocol()
    features = set(protocol.reader_features or ()) | ({f"readerVersion{protocol.min_reader_version}"}
                                                      if protocol.min_reader_version > 3 else set())
    if not features <= READABLE_READER_FEATURES:
        raise SinkError(f"the Delta table {root} needs reader features pgpoll cannot honour: {sorted(features)}",
                        "read it with Spark's Delta connector, or rebuild it with pgpoll materialize --full")
    refs: list[FileRef | DirRef] = []
    prefix = fs.path("")
    for path, _values in delta_files(fs):
        if not path.startswith(prefix.rstrip("/") + "/"):
            raise SinkError(f"the Delta table {root} names a file outside it: {path}", "pgpoll reads its own tables only")
        refs.append(FileRef((path[len(prefix.rstrip("/")) + 1:],)))
    schema = None if refs else pa.schema(table.schema().to_arrow())  # arro3 via the C interface
    return refs, schema


def plan_output(opts: SourceOptions) -> tuple[pa.Schema, list[OutputScan]]:
    """What a batch read of an output reads: its Arrow schema (before Spark's own), and the tasks."""
    assert opts.path is not None
    if opts.state is not None:
        root, refs, declared = _state_refs(opts)
        fs, base = output_filesystem(root)
        what = f"the state of {opts.state[0]}.{opts.state[1]}"
        schema = declared if declared is not None else _union_schema(fs, base, refs[:1], what)
        return schema, _group(root, STATE, refs, opts)
    if opts.table is not None:
        table_dir = layout.table_dir_name(*opts.table)
        refs = _log_refs(opts, table_dir)
        if not refs:
            raise ConfigError(f"no typed changes of {opts.table[0]}.{opts.table[1]} in {opts.path}"
                              + (" in that LSN range" if opts.after_lsn or opts.upto_lsn else ""),
                              "ingest with --typed-tables, and check the table's name (schema.table)")
        fs, base = output_filesystem(opts.path)
        # every partition carries every column the table has had so far: the newest one's are all of them
        newest = [r for r in refs if r.partition == refs[-1].partition]
        return _union_schema(fs, base, newest, f"typed table {table_dir}"), _group(opts.path, TYPED, refs, opts)
    return CHANGES_SCHEMA, _group(opts.path, CHANGES, _log_refs(opts, None), opts)


def _in_lsn_range(batch: pa.RecordBatch, column: str, after: int | None, upto: int | None) -> pa.RecordBatch:
    if column not in batch.schema.names or (after is None and upto is None):
        return batch
    values: Any = batch.column(batch.schema.names.index(column))
    keep: Any = None
    if after is not None:
        keep = pc.greater(values, pa.scalar(after, pa.int64()))
    if upto is not None:
        below = pc.less_equal(values, pa.scalar(upto, pa.int64()))
        keep = below if keep is None else pc.and_(keep, below)
    return batch.filter(keep)


def _open(fs: pafs.FileSystem, base: str, ref: FileRef | DirRef) -> Iterator[Any]:
    """The open Parquet files of ``ref``; a committed file moved between the look and the open is looked for again."""
    if isinstance(ref, DirRef):
        for path in _paths(fs, base, ref):
            try:
                yield open_parquet(fs, path)
            except FileNotFoundError:  # a Parquet state swapped in whole by a materialize run meanwhile
                raise SinkError(f"{path} went away while it was read (a newer state replaced it)",
                                "read again: the new state is complete") from None
        return
    for attempt in range(3):
        try:
            yield open_parquet(fs, _paths(fs, base, ref)[0])
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def read_scan(scan: OutputScan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One task's record batches, each exactly ``schema`` (runs on an executor)."""
    fs, base = output_filesystem(scan.root)
    wanted = [name for name in schema.names if name != "lsn_range"]
    for ref in scan.refs:
        partition = pa.scalar(ref.partition.split("=", 1)[1] if ref.partition else None, pa.string())
        for parquet in _open(fs, base, ref):
            for batch in read_batches(parquet, wanted):
                batch = _in_lsn_range(batch, scan.lsn_column, scan.after, scan.upto)
                if not batch.num_rows:
                    continue
                extra: dict[str, pa.Array[Any]] | None = (
                    {"lsn_range": pa.repeat(partition, batch.num_rows)} if scan.kind == CHANGES else None)
                yield conform(batch, schema, extra)
