"""Publishing batches into the output, and recovering after a crash.

A batch is written by Spark into ``_pgpoll/staging/<id>/`` (readers never
look there), then published in three steps: a manifest listing its files is
written into the staged directory; the directory is renamed to
``changes/lsn_range=<start>-<end>``; the commit-log record is written. Only
then does the caller advance the slot. With typed tables, each table's
staged directory is renamed to ``tables/<table>/lsn_range=<start>-<end>``
first, and the envelope's manifest lists their files too.

Recovery at the start of every run is deterministic:

* everything under ``staging/`` is removed (never published; the slot was not
  advanced past it, so the next peek returns those changes again);
* a partition under ``changes/`` without a commit-log record is *adopted*
  (its record is written) when its manifest is present and every listed file
  exists with the listed size — the crash came between rename and record;
  otherwise it is removed (a rename cut short on a store without atomic
  rename). Either way the slot still holds its changes, so nothing is lost.
  A typed-table partition that no commit-log record lists is removed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit_log import CommitLog, CommitRecord
from pgpoll.sink.filesystem import OutputFilesystem
from pgpoll.sink.typed_tables import tables_staging


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery found and did."""

    high_water_mark: Optional[Lsn]
    removed_staging: int
    adopted: tuple[str, ...]
    removed_partitions: tuple[str, ...]


class BatchSink:
    """The output path: staging, publishing and recovering batches."""

    def __init__(self, spark: Any, output: str) -> None:
        self.fs = OutputFilesystem(spark, output)
        self.log = CommitLog(self.fs)

    def check_writable(self) -> None:
        """Fail early (SinkError) when the output cannot be written."""
        probe = self.fs.path(layout.META, f"_probe-{uuid.uuid4().hex}")
        self.fs.mkdirs(self.fs.path(layout.META))
        self.fs.write_text(probe, "pgpoll")
        self.fs.delete(probe)

    def staging_path(self) -> str:
        """A fresh staging directory for one batch."""
        return self.fs.path(layout.STAGING, uuid.uuid4().hex)

    def discard(self, staging: str) -> None:
        """Remove a staged batch that will not be published."""
        self.fs.delete(staging)
        self.fs.delete(tables_staging(staging))

    def _data_files(self, directory: str) -> list[tuple[str, int]]:
        return [(n, size) for n, is_dir, size in self.fs.list(directory) if not is_dir and n.startswith("part-")]

    def publish(
        self, staging: str, *, start: int, end: int, rows: int, slot: str, plugin: str, last_commit_ts: Optional[str] = None,
        tables: Optional[dict[str, list[tuple[str, int]]]] = None,
    ) -> CommitRecord:
        """Move a staged batch (and its typed tables) into place and write its commit-log record."""
        partition: Optional[str] = None
        files: list[str] = []
        tables = tables or {}
        if rows > 0:
            data = self._data_files(staging)
            files = [n for n, _ in data]
            partition = layout.partition_name(start, end)
            target = self.fs.path(layout.CHANGES, partition)
            if self.fs.exists(target):
                raise SinkError(
                    f"partition {partition} already exists but has no commit-log record",
                    "rerun: recovery at start adopts or removes it",
                )
            for name in sorted(tables):
                typed_target = self.fs.path(layout.TABLES, name, partition)
                if self.fs.exists(typed_target):  # left by an attempt that never got its record
                    self.fs.delete(typed_target)
                self.fs.mkdirs(self.fs.path(layout.TABLES, name))
                self.fs.rename(f"{tables_staging(staging)}/{name}", typed_target)
            manifest = {
                "files": {n: size for n, size in data}, "rows": rows, "start": str(Lsn(start)), "end": str(Lsn(end)),
                "tables": {name: {n: size for n, size in listed} for name, listed in tables.items()},
            }
            self.fs.write_text(f"{staging}/{layout.MANIFEST}", json.dumps(manifest, sort_keys=True))
            self.fs.rename(staging, target)
        else:
            self.fs.delete(staging)
        self.fs.delete(tables_staging(staging))
        record = CommitRecord(
            start=str(Lsn(start)), end=str(Lsn(end)), rows=rows, files=files, partition=partition, slot=slot,
            plugin=plugin, last_commit_ts=last_commit_ts, tables=sorted(tables) if partition else [],
        )
        self.log.append(record)
        return record

    def recover(self, *, slot: str, plugin: str) -> RecoveryReport:
        """Clean staging, adopt or remove unrecorded partitions; return the high-water mark."""
        staged = self.fs.list(self.fs.path(layout.STAGING))
        for name, _is_dir, _size in staged:
            self.fs.delete(self.fs.path(layout.STAGING, name))
        adopted: list[str] = []
        removed: list[str] = []
        for name, is_dir, _size in self.fs.list(self.fs.path(layout.CHANGES)):
            bounds = layout.parse_partition_name(name) if is_dir else None
            if bounds is None or self.log.has(bounds[1]):
                continue
            directory = self.fs.path(layout.CHANGES, name)
            manifest = self._read_manifest(directory)
            present = dict(self._data_files(directory))
            if manifest is not None and manifest.get("files") and all(
                present.get(f) == size for f, size in manifest["files"].items()
            ) and self._typed_complete(name, manifest.get("tables", {})):
                self.log.append(
                    CommitRecord(
                        start=str(bounds[0]), end=str(bounds[1]), rows=int(manifest.get("rows", 0)),
                        files=sorted(manifest["files"]), partition=name, slot=slot, plugin=plugin, adopted=True,
                        tables=sorted(manifest.get("tables", {})),
                    )
                )
                adopted.append(name)
            else:
                self.fs.delete(directory)
                removed.append(name)
        recorded = {(t, r.partition) for r in self.log.records() for t in r.tables}
        for table, is_dir, _size in self.fs.list(self.fs.path(layout.TABLES)):
            for name, part_is_dir, _s in self.fs.list(self.fs.path(layout.TABLES, table)) if is_dir else ():
                bounds = layout.parse_partition_name(name) if part_is_dir else None
                if bounds is not None and (table, name) not in recorded:
                    self.fs.delete(self.fs.path(layout.TABLES, table, name))
                    removed.append(f"{layout.TABLES}/{table}/{name}")
        return RecoveryReport(self.log.high_water_mark(), len(staged), tuple(adopted), tuple(removed))

    def _typed_complete(self, partition: str, tables: dict[str, dict[str, int]]) -> bool:
        for table, files in tables.items():
            present = dict(self._data_files(self.fs.path(layout.TABLES, table, partition)))
            if any(present.get(f) != size for f, size in files.items()):
                return False
        return True

    def _read_manifest(self, directory: str) -> Optional[dict[str, Any]]:
        path = f"{directory}/{layout.MANIFEST}"
        if not self.fs.exists(path):
            return None
        try:
            data = json.loads(self.fs.read_text(path))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
