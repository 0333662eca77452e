"""The files of a snapshot in the output: plan, chunk manifests, completion, data, and the per-table leases.

A snapshot (``pgpoll snapshot``) is checkpointed by its own files, so a
killed run resumes where it stopped and a retried or speculative Spark task
is harmless:

* ``PATH/_pgpoll/snapshots/<sid>/plan.json`` -- created exclusively before any
  chunk is read: the tables, their typed columns, and every chunk's bounds;
* ``PATH/_pgpoll/snapshots/<sid>/<dir>/chunk-<n:06d>.json`` -- one manifest per
  finished chunk (its ``pg_current_snapshot()``, rows, files), created
  exclusively: of two tasks that read the same chunk the first manifest wins;
* ``PATH/snapshots/<sid>/<dir>/chunk=<n>/part-00000.parquet`` -- the chunk's
  rows. A task writes ``<dir>/_attempts/<n>-<uuid>.parquet`` first, then the
  manifest naming that attempt, then renames the attempt to the final name.
  The loser of the manifest race deletes its attempt; resume finishes the
  rename of a winner that died in between and deletes attempts no manifest
  names. On an object store (no rename) the attempt is written once at its
  final key, ``chunk=<n>/part-00000-<uuid>.parquet``, and the manifest names
  it; resume deletes the files under ``chunk=<n>/`` that no manifest names;
* ``PATH/_pgpoll/snapshots/<sid>/complete.json`` -- when every chunk is in
  and the transactions in progress in any chunk's snapshot have finished
  (the convergence LSN). A snapshot is complete iff this file exists.

``<sid>`` is ``YYYYMMDDTHHMMSSZ-xxxx`` (UTC start time and 4 random hex
digits): names sort by start time. ``<dir>`` is
:func:`pgpoll.sink.layout.table_dir_name`. Everything goes through an
:class:`~pgpoll.sink.stores.filesystem.OutputFs`, so this is tested without a JVM.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.sink import layout
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.stores.filesystem import OutputFs

log = logging.getLogger("pgpoll.snapshot")

FORMAT = 1
_SID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{4}$")
_MANIFEST = re.compile(r"^chunk-(\d{6,})\.json$")


def new_snapshot_id(now: datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ-xxxx`` for a snapshot starting ``now`` (UTC)."""
    when = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{when:%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


def is_snapshot_id(name: str) -> bool:
    """True for a name :func:`new_snapshot_id` makes."""
    return bool(_SID.match(name))


def manifest_name(n: int) -> str:
    """``chunk-<n:06d>.json``."""
    return f"chunk-{n:06d}.json"


#: The first number of a recheck piece (key-range and block chunks are numbered from 0, far below it).
RECHECK_FIRST = 1_000_000


def chunk_file(n: int, attempt: str | None = None) -> str:
    """The data file of chunk ``n``, relative to its table's data directory (``attempt``: on an object store, the
    attempt's own file name, written once at its final place)."""
    if n >= RECHECK_FIRST:
        return f"_recheck/part-{n}.parquet" if attempt is None else f"_recheck/{n}-{attempt}"
    return f"chunk={n}/part-00000.parquet" if attempt is None else f"chunk={n}/{attempt}"


def now_iso() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.now(UTC).isoformat()


def list_snapshots(fs: OutputFs) -> list[str]:
    """The snapshot ids that have a metadata directory, oldest first."""
    return sorted(name for name, is_dir, _size in fs.list(fs.path(layout.SNAPSHOT_META)) if is_dir and is_snapshot_id(name))


class SnapshotStore:
    """The files of one snapshot (see the module docstring)."""

    def __init__(self, fs: OutputFs, snapshot_id: str) -> None:
        if not is_snapshot_id(snapshot_id):
            raise SinkError(f"{snapshot_id!r} is not a snapshot id", "snapshot ids look like 20261123T064500Z-3f9a")
        self.fs = fs
        self.snapshot_id = snapshot_id

    def meta(self, *parts: str) -> str:
        """``PATH/_pgpoll/snapshots/<sid>/...``."""
        return self.fs.path(layout.SNAPSHOT_META, self.snapshot_id, *parts)

    def data(self, *parts: str) -> str:
        """``PATH/snapshots/<sid>/...``."""
        return self.fs.path(layout.SNAPSHOTS, self.snapshot_id, *parts)

    # ---- plan and completion -------------------------------------------------------------------

    def create_plan(self, plan: Mapping[str, Any]) -> None:
        """Write ``plan.json`` exclusively (SinkError when it exists: snapshot ids are never reused)."""
        if not self.fs.create_exclusive(self.meta(layout.SNAPSHOT_PLAN), json.dumps(plan, sort_keys=True)):
            raise SinkError(f"snapshot {self.snapshot_id} already has a plan", "run the snapshot again")

    def plan(self) -> dict[str, Any]:
        """The plan (SinkError when it is missing or damaged)."""
        return _read_json(self.fs, self.meta(layout.SNAPSHOT_PLAN))

    def complete(self) -> dict[str, Any] | None:
        """``complete.json``, or None while the snapshot is incomplete."""
        path = self.meta(layout.SNAPSHOT_COMPLETE)
        return _read_json(self.fs, path) if self.fs.exists(path) else None

    def write_complete(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``complete.json`` (exclusively); returns what the file holds (an earlier writer's wins)."""
        if self.fs.create_exclusive(self.meta(layout.SNAPSHOT_COMPLETE), json.dumps(doc, sort_keys=True)):
            return dict(doc)
        done = self.complete()
        assert done is not None
        return done

    # ---- chunks ----------------------------------------------------------------------------------

    def manifests(self, table_dir: str) -> dict[int, dict[str, Any]]:
        """The finished chunks of one table, by number."""
        out: dict[int, dict[str, Any]] = {}
        for name, is_dir, _size in self.fs.list(self.meta(table_dir)):
            m = _MANIFEST.match(name)
            if m and not is_dir:
                out[int(m.group(1))] = _read_json(self.fs, self.meta(table_dir, name))
        return out

    def attempt(self, table_dir: str, n: int) -> tuple[str, str]:
        """A fresh attempt file for chunk ``n``: ``(name, path)`` (on an object store, at its final key)."""
        if self.fs.direct_writes:
            name = f"part-00000-{uuid.uuid4().hex}.parquet"
            return name, self.data(table_dir, chunk_file(n, name))
        name = f"{n}-{uuid.uuid4().hex}.parquet"
        return name, self.data(table_dir, layout.SNAPSHOT_ATTEMPTS, name)

    def final_path(self, table_dir: str, n: int) -> str:
        """Where chunk ``n``'s data ends up."""
        return self.data(table_dir, chunk_file(n))

    def publish(self, table_dir: str, n: int, attempt_name: str, manifest: Mapping[str, Any]) -> bool:
        """Publish a written attempt: manifest (exclusive), then the final name. False: another attempt won.

        The loser deletes its own attempt and changes nothing else.
        """
        direct = self.fs.direct_writes
        final = chunk_file(n, attempt_name) if direct else chunk_file(n)
        doc = {**manifest, "n": n, "attempt": attempt_name, "files": [final]}
        attempt_path = self.data(table_dir, final) if direct else self.data(table_dir, layout.SNAPSHOT_ATTEMPTS, attempt_name)
        if not self.fs.create_exclusive(self.meta(table_dir, manifest_name(n)), json.dumps(doc, sort_keys=True)):
            self.fs.delete(attempt_path)
            return False
        if not direct:
            self._finish(table_dir, n, attempt_name)
        return True

    def _finish(self, table_dir: str, n: int, attempt_name: str) -> bool:
        """Rename the winning attempt to its final name; False when neither exists (the data is lost)."""
        if self.fs.direct_writes:  # written at its final key: nothing to rename
            return self.fs.exists(self.data(table_dir, chunk_file(n, attempt_name)))
        final = self.final_path(table_dir, n)
        if self.fs.exists(final):
            return True
        attempt_path = self.data(table_dir, layout.SNAPSHOT_ATTEMPTS, attempt_name)
        if not self.fs.exists(attempt_path):
            return False
        self.fs.rename(attempt_path, final)
        return True

    def resume_table(self, table_dir: str) -> dict[int, dict[str, Any]]:
        """Repair one table after a crash; returns its finished chunks.

        Finishes the rename of every manifest whose final file is missing;
        a manifest whose data is gone altogether is removed (the chunk is read
        again); attempts no manifest names are deleted. Only under the
        table's lease: a task still running for this snapshot would lose its
        attempt.
        """
        done = self.manifests(table_dir)
        for n, manifest in sorted(done.items()):
            if not self._finish(table_dir, n, str(manifest.get("attempt", ""))):
                log.warning("snapshot %s: chunk %d of %s lost its data; it is read again", self.snapshot_id, n, table_dir)
                self.fs.delete(self.meta(table_dir, manifest_name(n)))
                del done[n]
        named = {str(m.get("attempt", "")) for m in done.values()}
        if self.fs.direct_writes:  # attempts sit at their final place: delete those no manifest names
            kept = {f for m in done.values() for f in m.get("files", ())}
            for chunk_dir, is_dir, _size in self.fs.list(self.data(table_dir)):
                if is_dir and (chunk_dir.startswith("chunk=") or chunk_dir == "_recheck"):
                    for name, _d, _s in self.fs.list(self.data(table_dir, chunk_dir)):
                        if f"{chunk_dir}/{name}" not in kept:
                            self.fs.delete(self.data(table_dir, chunk_dir, name))
            return done
        attempts = self.data(table_dir, layout.SNAPSHOT_ATTEMPTS)
        for name, _is_dir, _size in self.fs.list(attempts):
            if name not in named or self.fs.exists(self.final_path(table_dir, _attempt_chunk(name))):
                self.fs.delete(f"{attempts}/{name}")
        return done

    def reset_table(self, table_dir: str) -> None:
        """Forget every chunk of one table (a shared-snapshot table is read again as a whole)."""
        for n in self.manifests(table_dir):
            self.fs.delete(self.meta(table_dir, manifest_name(n)))
        self.fs.delete(self.data(table_dir))


def _attempt_chunk(name: str) -> int:
    """The chunk number of an attempt file name (-1 for anything else)."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def _read_json(fs: OutputFs, path: str) -> dict[str, Any]:
    try:
        data = json.loads(fs.read_text(path))
    except ValueError as exc:
        raise SinkError(f"damaged snapshot file {path}: {exc}", "delete that snapshot's directories and run it again") from None
    if not isinstance(data, dict):
        raise SinkError(f"damaged snapshot file {path}: not an object", "delete that snapshot and run it again")
    return data


def find_resumable(fs: OutputFs, args: Mapping[str, Any]) -> str | None:
    """The newest incomplete snapshot planned with the same normalised ``args``, or None."""
    for sid in reversed(list_snapshots(fs)):
        store = SnapshotStore(fs, sid)
        if not fs.exists(store.meta(layout.SNAPSHOT_PLAN)) or store.complete() is not None:
            continue
        try:
            plan = store.plan()
        except SinkError:
            continue
        if plan.get("args") == dict(args):
            return sid
    return None


@dataclass(frozen=True)
class CompleteSnapshot:
    """One table's part of a complete snapshot: what materialize starts from."""

    snapshot_id: str
    plan: dict[str, Any]
    table: dict[str, Any]  # the plan's entry for the table
    manifests: list[dict[str, Any]]  # its chunks' manifests, by chunk number
    complete: dict[str, Any]  # complete.json
    data_dir: str  # PATH/snapshots/<sid>/<dir> (chunk=<n>/part-00000.parquet below it)

    def chunk_paths(self) -> list[str]:
        """The data file of every chunk, in chunk order."""
        return [f"{self.data_dir}/{f}" for m in self.manifests for f in m.get("files", ())]


CompleteEntry = tuple[SnapshotStore, dict[str, Any], dict[str, Any]]


def complete_snapshots(fs: OutputFs) -> list[CompleteEntry]:
    """``(store, plan, complete.json)`` of every complete snapshot, newest first (ids sort by start time)."""
    out: list[CompleteEntry] = []
    for sid in reversed(list_snapshots(fs)):
        store = SnapshotStore(fs, sid)
        done = store.complete()
        if done is not None:
            out.append((store, store.plan(), done))
    return out


def newest_holding(snapshots: list[CompleteEntry], schema: str, table: str) -> tuple[CompleteEntry, dict[str, Any]] | None:
    """The newest of ``snapshots`` whose plan holds ``schema.table``, with that table's plan entry."""
    for entry in snapshots:
        t = next((t for t in entry[1].get("tables", ()) if t.get("schema") == schema and t.get("table") == table), None)
        if t is not None:
            return entry, t
    return None


def latest_complete(fs: OutputFs, schema: str, table: str) -> CompleteSnapshot | None:
    """The complete snapshot with the greatest id that contains ``schema.table``, or None."""
    found = newest_holding(complete_snapshots(fs), schema, table)
    if found is None:
        return None
    (store, plan, done), entry = found
    manifests = store.manifests(str(entry["dir"]))
    return CompleteSnapshot(store.snapshot_id, plan, entry, [manifests[n] for n in sorted(manifests)], done,
                            store.data(str(entry["dir"])))


def table_lease(fs: OutputFs, schema: str, table: str, *, run: str, slot: str, enabled: bool | None = None) -> Lease:
    """The lease one snapshot run holds on one table (a second run on the table exits 3 at once)."""
    name = layout.table_dir_name(schema, table)
    return Lease(
        fs, run=run, slot=slot, enabled=enabled, path=f"{layout.SNAPSHOT_LEASES}/snapshot-{name}.json",
        what="snapshot run", holds=f"table {schema}.{table} in the output",
    )
