"""The Delta Lake edge of ``pgpoll materialize --format delta``: pin a table's version, commit a state once.

Spark cannot load Delta's jars here, so Spark writes the state's Parquet files
into the table's directory and delta-rs (``deltalake``) publishes them: one
Delta commit per table and run that either removes every file of the version
the run read and adds the new ones (``create_write_transaction`` in
``overwrite`` mode, which also replaces the table's schema, so ADD and DROP
COLUMN reach the Delta schema), or, for an incremental run that rewrote only
some files (:mod:`pgpoll.materialize.delta.files`), removes exactly those and
adds their replacements (``append`` mode with ``RemoveAction`` entries, the
only mode delta-rs 1.6.6 accepts them in; ``append`` keeps the table's
schema, so that path is taken only when the schema is unchanged). Nothing
here needs a JVM, so it is tested on its own.

Three guarantees, all resting on the Delta log's own atomic create of
``_delta_log/<version>.json``:

* *Pinned*: a commit is made on the snapshot the run read, with no retry
  (``max_commit_retries=0``). When anyone else (another pgpoll, another tool)
  wrote a newer version first, the commit fails and the run reports a
  :class:`SinkError` naming that version and its writer: it never merges
  over it. The first commit creates the table only if none exists.
* *Idempotent*: each commit records an application transaction
  ``pgpoll:<dest>`` whose version is the commit-log position (the end LSN, as
  an integer) the state reflects. Before committing, the latest
  ``transaction_version`` is read; a position already applied is skipped
  (delta-rs does not skip one itself), so a retried or crashed run never
  applies a batch twice, nor loses one (the state and its position are one
  commit).
* *Readable by pgpoll*: the next run reads the files of the pinned version
  directly with Spark, so a table whose protocol needs reader features other
  than ``timestampNtz`` (deletion vectors, column mapping, written by another
  engine) is refused rather than misread.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from pgpoll.errors import SinkError, first_line
from pgpoll.sink.stores.filesystem import local_path

APP_PREFIX = "pgpoll:"
META_KEY = "pgpoll"
"""The key of pgpoll's own object in a commit's ``commitInfo`` (position, schema id, rows, run, output)."""
READABLE_READER_FEATURES = frozenset({"timestampNtz"})
_HISTORY_LIMIT = 50


def delta_uri(path: str) -> str:
    """The location delta-rs is given for a pgpoll path: the OS path for local paths and ``file:`` URIs.

    ``s3a:``/``s3n:`` (Hadoop's names) become ``s3:``; other URIs go through unchanged.
    """
    local = local_path(path)
    if local is not None:
        return local
    scheme = urlparse(path).scheme
    return "s3" + path[len(scheme):] if scheme in ("s3a", "s3n") else path


def app_id(dest: str) -> str:
    """The application id of pgpoll's transactions in the tables under ``dest``.

    A local DEST is named as Hadoop qualifies it (``file:/path``), as pgpoll
    did when it opened destinations through Hadoop: tables written then keep
    their position.
    """
    if dest.startswith("/"):
        dest = f"file:{os.path.abspath(dest)}"
    return f"{APP_PREFIX}{dest}"


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into the table's directory: its path relative to the table, size and statistics.

    ``records`` is -1 for a file of the log without a record count (written by another engine).
    """

    path: str
    size: int
    records: int
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)
    null_count: Mapping[str, int] = field(default_factory=dict)

    def stats_json(self) -> str:
        """Delta's per-file ``stats``: record count, and min/max/null count where known."""
        stats: dict[str, Any] = {"numRecords": self.records}
        if self.records:
            if self.min_values:
                stats["minValues"] = dict(self.min_values)
                stats["maxValues"] = dict(self.max_values)
            if self.null_count:
                stats["nullCount"] = dict(self.null_count)
        return json.dumps(stats, sort_keys=True, default=str)


@dataclass(frozen=True)
class PinnedVersion:
    """What a run read of one Delta table: the version it builds on (None: no table yet)."""

    uri: str
    version: int | None
    applied: int | None
    """The transaction version (commit-log position) pgpoll recorded in that version, if any."""
    files: tuple[str, ...] = ()
    """The data files of that version, relative to the table (or absolute URIs)."""
    stats: tuple[DataFile, ...] = ()
    """The same files with their size and the statistics the log holds for them (None where it holds none)."""
    meta: Mapping[str, Any] | None = None
    """pgpoll's object of the newest pgpoll commit up to that version (schema id, rows...)."""
    reader_features: frozenset[str] = frozenset()
    table: Any = None

    @property
    def readable(self) -> bool:
        """True when pgpoll may read the version's files as plain Parquet."""
        return self.reader_features <= READABLE_READER_FEATURES


class DeltaStateTable:
    """One table's Delta log at ``uri``, written by pgpoll under the application id ``app``."""

    def __init__(self, uri: str, app: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = uri
        self.app = app
        self.storage_options = storage_options

    def exists(self) -> bool:
        """True when ``uri`` holds a Delta table."""
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options))

    def _open(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable

        try:
            return DeltaTable(self.uri, version=version, storage_options=self.storage_options)
        except Exception as exc:
            raise SinkError(f"cannot read the Delta table {self.uri}: {first_line(exc)}",
                            "check the destination, or rebuild it with --full into an empty --to") from None

    def pin(self) -> PinnedVersion:
        """The table's current version, which this run builds on and commits after."""
        if not self.exists():
            return PinnedVersion(self.uri, None, None)
        table = self._open()
        protocol = table.protocol()
        features = frozenset(protocol.reader_features or ())
        if protocol.min_reader_version > 3:
            features |= {f"readerVersion{protocol.min_reader_version}"}
        stats = _log_files(table)
        meta = next((m for m in (_pgpoll_meta(c) for c in table.history(_HISTORY_LIMIT)) if m is not None), None)
        return PinnedVersion(self.uri, int(table.version()), table.transaction_version(self.app),
                             files=tuple(f.path for f in stats), stats=stats, meta=meta, reader_features=features,
                             table=table)

    def writer_of(self, version: int) -> str:
        """Who wrote ``version``, as the log says (pgpoll's run, or the engine and operation)."""
        try:
            info = self._open(version).history(1)[0]
        except (SinkError, IndexError):
            return "an unknown writer"
        meta = _pgpoll_meta(info)
        if meta is not None:
            return f"pgpoll run {meta.get('run', '?')}"
        return f"{info.get('engineInfo') or info.get('clientVersion') or 'another engine'} ({info.get('operation', '?')})"

    def conflict(self, pinned: PinnedVersion, found: int) -> SinkError:
        """The error for a version written by someone else after ``pinned`` was read."""
        first = 0 if pinned.version is None else pinned.version + 1
        read = "no table" if pinned.version is None else f"version {pinned.version}"
        return SinkError(
            f"{self.uri}: version {first} was written by {self.writer_of(first)} after this run read {read} "
            f"(now at version {found}); not committed over it",
            "find out who else writes this table (one writer at a time); then rerun pgpoll materialize, "
            "which builds on the newest version",
        )

    def latest_version(self) -> int | None:
        """The newest version now (None: no table)."""
        return int(self._open().version()) if self.exists() else None

    def holds_files_under(self, directory: str) -> bool:
        """True when the newest version has a data file under ``directory`` (relative to the table)."""
        if not self.exists():
            return False
        prefix = directory.rstrip("/") + "/"
        return any(str(p).startswith(prefix) for p in _column(self._open().get_add_actions(flatten=True), "path"))

    def commit(self, pinned: PinnedVersion, files: Sequence[DataFile], schema: Any, position: int,
               meta: Mapping[str, Any], *, force: bool = False, replaces: Sequence[DataFile] | None = None) -> int | None:
        """Publish ``files`` as the table's whole state at commit-log position ``position``.

        With ``replaces`` (files of ``pinned``), ``files`` replace only those:
        the version's other files stay (an incremental run that rewrote part
        of the state; ``schema`` must then be the table's, which ``append``
        mode keeps). Returns the new version, or None when ``position`` was
        already applied (then nothing is committed; ``force``, for
        ``--full``, commits anyway). Raises :class:`SinkError` when another
        writer committed after ``pinned``.
        """
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions

        latest = self.latest_version()
        if latest != pinned.version:
            raise self.conflict(pinned, -1 if latest is None else latest)
        if not force and pinned.applied is not None and pinned.applied >= position:
            return None
        now = int(time.time() * 1000)
        adds = [AddAction(f.path, f.size, {}, now, True, f.stats_json()) for f in files]
        properties = CommitProperties(
            custom_metadata={META_KEY: json.dumps(dict(meta), sort_keys=True)},
            max_commit_retries=0,
            app_transactions=[Transaction(self.app, position)],
        )
        delta_schema = schema if isinstance(schema, Schema) else Schema.from_arrow(schema)
        try:
            if pinned.version is None:
                create_table_with_add_actions(self.uri, delta_schema, adds, mode="error",
                                              storage_options=self.storage_options, commit_properties=properties)
                return 0
            if replaces is None:
                pinned.table.create_write_transaction(adds, "overwrite", delta_schema, commit_properties=properties)
            else:
                removes = [RemoveAction(f.path, True, now, f.size) for f in replaces]
                pinned.table.create_write_transaction([*removes, *adds], "append", delta_schema,
                                                      commit_properties=properties)
        except CommitFailedError:
            raise self.conflict(pinned, self.latest_version() or 0) from None
        except Exception as exc:
            if pinned.version is None and self.exists():  # created by someone else meanwhile
                raise self.conflict(pinned, self.latest_version() or 0) from None
            raise SinkError(f"cannot commit to the Delta table {self.uri}: {first_line(exc)}",
                            "check the destination is writable; the next run retries from the last version") from None
        return pinned.version + 1


    def maintain(self, retention_hours: float) -> dict[str, Any]:
        """Checkpoint the newest version, clean up expired log files and vacuum the files no version within
        ``retention_hours`` needs (:mod:`pgpoll.materialize.maintenance`); what was done, for the summary."""
        table = self._open()
        table.create_checkpoint()
        checkpoint = int(table.version())
        table.cleanup_metadata()
        hours = math.ceil(retention_hours)  # delta-rs takes whole hours: never sooner than asked
        removed = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
        return {"checkpoint": checkpoint, "vacuumed_files": len(removed), "retention_hours": retention_hours}


def footer_files(directory: str, prefix: str, stat_columns: Sequence[str], fs: Any = None) -> list[DataFile]:
    """The Parquet files in ``directory`` (of ``fs``, an OutputFs; None: a local directory) as :class:`DataFile`
    (paths ``prefix/<file>``), from their footers.

    Record counts and the null counts, minimum and maximum of ``stat_columns``
    come from the row groups' statistics, without reading any data; a column
    gets a minimum and maximum only when every row group that holds a
    non-null value has them.
    """
    import pyarrow.parquet as pq

    out: list[DataFile] = []
    if fs is None:
        listed = [(e, os.path.getsize(os.path.join(directory, e))) for e in sorted(os.listdir(directory))]
    else:
        listed = sorted((n, size) for n, is_dir, size in fs.list(directory) if not is_dir)
    for entry, file_size in listed:
        if not entry.endswith(".parquet"):
            continue
        path = os.path.join(directory, entry) if fs is None else f"{directory}/{entry}"
        meta = (pq.read_metadata(path) if fs is None
                else pq.read_metadata(fs.arrow_path(path), filesystem=fs.arrow()))
        index = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        nulls: dict[str, int] = {}
        for name in stat_columns:
            if name not in index:
                continue
            counts: list[int] = []
            ranges: list[tuple[Any, Any] | None] = []  # per row group holding a non-null value
            for g in range(meta.num_row_groups):
                chunk = meta.row_group(g).column(index[name])
                stats: Any = chunk.statistics
                if stats is None or not stats.has_null_count:
                    break
                counts.append(int(stats.null_count))
                if int(stats.null_count) < int(chunk.num_values):
                    ranges.append((stats.min, stats.max) if stats.has_min_max else None)
            else:
                nulls[name] = sum(counts)
                known = [r for r in ranges if r is not None]
                if known and len(known) == len(ranges):
                    low[name] = min(lo for lo, _ in known)
                    high[name] = max(hi for _, hi in known)
        out.append(DataFile(f"{prefix}/{entry}", file_size, int(meta.num_rows), low, high, nulls))
    return out


def _column(table: Any, name: str) -> list[Any]:
    import pyarrow as pa

    return list(pa.table(table).column(name).to_pylist())


def _log_files(table: Any) -> tuple[DataFile, ...]:
    """The data files of a version as the log describes them (statistics parsed to the table's types)."""
    import pyarrow as pa

    out: list[DataFile] = []
    for a in pa.table(table.get_add_actions(flatten=False)).to_pylist():
        low, high, nulls = a.get("min") or {}, a.get("max") or {}, a.get("null_count") or {}
        records = a.get("num_records")
        out.append(DataFile(
            str(a["path"]), int(a["size_bytes"]), -1 if records is None else int(records),
            {c: v for c, v in low.items() if v is not None}, {c: v for c, v in high.items() if v is not None},
            {c: int(v) for c, v in nulls.items() if v is not None},
        ))
    return tuple(out)


def _pgpoll_meta(commit_info: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = commit_info.get(META_KEY)
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
