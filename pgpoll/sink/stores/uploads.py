"""A batch's data files on an object store: written once, at their final key, and accounted for before they are.

An object store has no rename: a "move" is a copy, a full rewrite of every
byte. So on a store (``fs.direct_writes``) the batch task writes its Parquet
files to a local spill directory and, once the batch is complete and its LSN
range known, uploads each file straight to where it will stay:
``changes/lsn_range=<start>-<end>/part-...`` and
``tables/<dir>/lsn_range=<start>-<end>/part-...``. Nothing is ever copied
after it is written.

Such a file is visible to a plain listing before its batch is committed, and
if the run loses the commit log's compare-and-set it belongs to nobody. So
before the first byte goes up, the task writes the *upload manifest*
``_pgpoll/staging/<id>.files.json`` (the plan's staging id) listing every key
it is about to write. Then:

* the winner's record names the same files; recovery (or the winner itself)
  removes the manifest and the plan file, never the files;
* a loser deletes the files it uploaded and its manifest;
* a run killed on the way leaves its manifest: recovery deletes the files it
  lists once the plan is stale (planned on a record older than the head: it
  can never win), exactly as it deletes stale staging on a local disk, and
  deletes them again after removing the manifest, so a task still uploading
  when the manifest went cannot leave a file behind (it checks its manifest
  and its plan after its last upload and deletes its own files when either
  is gone; a manifest written after recovery removed it has no plan file
  beside it, and the next recovery deletes what it lists).

The spill directory itself (:func:`new_spill_directory`) is removed by the
task when the batch is done, or by a later batch on the same host when the
process was killed first.

Readers that must never see a losing or unfinished batch read the change
log's Delta table (:mod:`pgpoll.sink.change_table`) or the commit log, not a
listing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pgpoll.errors import FenceLostError
from pgpoll.sink import layout
from pgpoll.sink.stores.output_fs import OutputFs

MANIFEST_SUFFIX = ".files.json"
UPLOAD_THREADS = 4
"""Files uploaded at once (each large one in parts, by the store client)."""


def manifest_path(fs: OutputFs, sid: str) -> str:
    """``_pgpoll/staging/<sid>.files.json``."""
    return fs.path(layout.STAGING, sid + MANIFEST_SUFFIX)


@dataclass(frozen=True)
class UploadedBatch:
    """What a batch put on the store: its partition, the envelope's files and each typed table's (name -> size)."""

    partition: str
    files: dict[str, int] = field(default_factory=dict)
    tables: dict[str, dict[str, int]] = field(default_factory=dict)

    def paths(self, fs: OutputFs) -> list[str]:
        """Every key of the batch, as paths of ``fs``."""
        out = [fs.path(layout.CHANGES, self.partition, name) for name in self.files]
        out += [fs.path(layout.TABLES, table, self.partition, name) for table, files in self.tables.items() for name in files]
        return out

    def to_json(self) -> str:
        """The manifest's content."""
        return json.dumps({"partition": self.partition, "files": self.files, "tables": self.tables}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> UploadedBatch:
        """Parse a manifest."""
        data: dict[str, Any] = json.loads(text)
        return cls(str(data["partition"]), {str(k): int(v) for k, v in dict(data.get("files") or {}).items()},
                   {str(t): {str(k): int(v) for k, v in dict(f).items()} for t, f in dict(data.get("tables") or {}).items()})


def _local_files(directory: str | None) -> dict[str, int]:
    if directory is None or not os.path.isdir(directory):
        return {}
    return {n: os.path.getsize(os.path.join(directory, n)) for n in sorted(os.listdir(directory)) if n.startswith("part-")}


def upload_batch(fs: OutputFs, sid: str, envelope_dir: str, tables_dir: str | None, partition: str) -> UploadedBatch:
    """Upload a batch spilled under ``envelope_dir`` (and ``tables_dir/<table>/``) to its final keys.

    The manifest is written first; after the last upload it and the plan file
    are checked: when recovery removed either (the plan went stale: another
    run won this record), the uploaded files are deleted again and
    :class:`FenceLostError` is raised.
    """
    tables = {t: found for t in (sorted(os.listdir(tables_dir)) if tables_dir and os.path.isdir(tables_dir) else [])
              if (found := _local_files(os.path.join(tables_dir or "", t)))}
    batch = UploadedBatch(partition, _local_files(envelope_dir), tables)
    fs.write_text(manifest_path(fs, sid), batch.to_json())
    work = [(os.path.join(envelope_dir, n), fs.path(layout.CHANGES, partition, n)) for n in batch.files]
    work += [(os.path.join(tables_dir or "", t, n), fs.path(layout.TABLES, t, partition, n))
             for t, files in tables.items() for n in files]
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        for _size in pool.map(lambda job: fs.put_file(*job), work):
            pass
    if not fs.exists(manifest_path(fs, sid)) or not fs.exists(fs.path(layout.STAGING, sid + layout.PLAN_SUFFIX)):
        delete_uploaded(fs, batch)
        fs.delete(manifest_path(fs, sid))
        raise FenceLostError(
            f"the batch planned as {sid} went stale while it uploaded (another run committed its record first)",
            "only one ingest run per output at a time: let the other run finish",
        )
    return batch


def delete_uploaded(fs: OutputFs, batch: UploadedBatch) -> None:
    """Delete a batch's uploaded files (absent ones are not an error)."""
    paths = batch.paths(fs)
    remover = getattr(fs, "delete_files", None)
    if remover is not None:
        remover(paths)
    else:
        for path in paths:
            fs.delete(path)


def read_manifest(fs: OutputFs, sid: str) -> UploadedBatch | None:
    """The upload manifest of ``sid`` (None when there is none, or it is damaged: a damaged one was never used)."""
    found = fs.read_tagged(manifest_path(fs, sid))
    if found is None:
        return None
    try:
        return UploadedBatch.from_json(found[0])
    except (ValueError, KeyError, TypeError):
        return None


def remove_uploads(fs: OutputFs, sid: str) -> None:
    """Delete the files a stale or losing plan uploaded, its manifest, then the files again (see the module docstring)."""
    batch = read_manifest(fs, sid)
    if batch is None:
        fs.delete(manifest_path(fs, sid))
        return
    delete_uploaded(fs, batch)
    fs.delete(manifest_path(fs, sid))
    delete_uploaded(fs, batch)


SPILL_PREFIX = "pgpoll-batch-"


def spill_prefix() -> str:
    """The start of this host's spill directories' names, before the process id: ``pgpoll-batch-<host>-``."""
    return f"{SPILL_PREFIX}{socket.gethostname()}-"


def new_spill_directory(root: str | None = None) -> str:
    """A new local spill directory for one batch (in ``root``, default the system's temporary directory).

    It is named ``pgpoll-batch-<host>-<pid>-<random>`` and the task removes
    it when the batch is done, but a process killed with SIGKILL (or by the
    OOM killer) never gets there, and a spill may hold a whole batch. So
    first this removes the spill directories of this host whose process is
    gone; those of a live process, or of another host sharing the
    directory, are left alone.
    """
    root = root or tempfile.gettempdir()
    prefix = spill_prefix()
    with os.scandir(root) as entries:
        for entry in entries:
            pid = entry.name[len(prefix):].split("-", 1)[0] if entry.name.startswith(prefix) else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _process_exists(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists (and may be signalled)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
