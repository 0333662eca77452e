"""The recheck: the rows a chunked table's chunks can have missed, read again after the last chunk.

The rare case (issue 26). Chunks of a table are read under different
snapshots, one after the other. An UPDATE that changes a row's key and
commits after the chunk of the new key was read but before the chunk of the
old key is read leaves the row in neither chunk's rows; materialize still
places the row at its new key from the change (its transaction is invisible
to the new key's chunk), but a change does not carry the row's *unchanged
TOASTed values*, and no chunk holds them: they would be lost. Chains of such
moves (each into a chunk read earlier than the one it leaves) lose them the
same way.

Detection, here in the snapshot job and without the change log: after the
last chunk of the table was read, every *recheck piece* -- a ctid block
range of the table (of each leaf), planned with the chunks, far larger than
a chunk since it returns only the few rows it matches -- reads, in its own
short ``REPEATABLE READ`` transaction like a chunk, every row written by a
transaction at or after ``since``: the smallest ``xmin`` of the chunks'
snapshots. Such a moved row was written by the UPDATE that moved it (or a
later one), which no chunk's snapshot saw finished before ``since``... so it
is among them, at its latest key, read under the recheck's snapshot, taken
after that UPDATE committed (the piece starts after every chunk's read). The
test is conservative (:func:`pgpoll.source.snapshot.chunks.written_since`:
subtransactions included, a few rows too many at worst); a table whose rows
cannot hold an out-of-line value (``SnapshotTable.recheck`` false) needs none.

Repair, in materialize (:mod:`pgpoll.materialize.recheck_fill`): a recheck
row is the row at its key *as of its piece's snapshot*; the last change at
that key whose transaction that snapshot sees (or the chunk's row, if none)
produced exactly this row version, so its unchanged TOASTed values are the
recheck row's. Nothing else changes: visibility, placement and every other
value are decided as without the recheck, so a recheck row can only fill a
value that was missing, never replace one.

A row that changes key again *during* the recheck, from a block range not
rechecked yet into one already rechecked, is not seen by either piece: that
double move within seconds is the one case left, and materialize says so
(``unresolved_toast`` and the warning) instead of guessing.

No transaction can have moved a row between the table's chunks when every
chunk's snapshot has the same ``xmax`` and no transaction was running in
any (``since`` equals the largest ``xmax``: no transaction id was handed out
between the first chunk's snapshot and the last one's): then the recheck is
skipped (:func:`needed`), as on a quiet database.

Completion does not wait for ingest: the recheck reads the source only.
Resume: a table whose key chunks are read again (a lost chunk file) drops its
recheck pieces first, so they always come after its last chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgpoll.sink.snapshot_store import RECHECK_FIRST, SnapshotStore, manifest_name

#: A recheck piece covers this many times a chunk's rows (it scans them, returning only the rows written since).
PIECE_SCALE = 8


def recheck_specs(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's recheck pieces of a table entry (``[]`` for a table without a recheck)."""
    return list(entry.get("rechecks") or ())


def since(manifests: Mapping[int, Mapping[str, Any]]) -> int:
    """The smallest ``xmin`` of the key chunks' snapshots: the recheck reads rows written at or after it."""
    return min(int(m["snapshot"]["xmin"]) for n, m in manifests.items() if n < RECHECK_FIRST)


def needed(manifests: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether a transaction may have committed between the key chunks' snapshots (see the module docstring):
    ``since`` below the largest ``xmax`` of their snapshots."""
    xmax = max(int(m["snapshot"]["xmax"]) for n, m in manifests.items() if n < RECHECK_FIRST)
    return since(manifests) < xmax


def forget(store: SnapshotStore, table_dir: str, done: Mapping[int, Mapping[str, Any]]) -> int:
    """Delete the table's finished recheck pieces (its key chunks are read again after them); returns how many."""
    gone = 0
    for n in sorted(done):
        if n >= RECHECK_FIRST:
            store.fs.delete(store.meta(table_dir, manifest_name(n)))
            store.fs.delete(store.final_path(table_dir, n))
            gone += 1
    return gone


def numbered(pieces: Sequence[Any]) -> list[Any]:
    """Block-range chunk specs renumbered from :data:`RECHECK_FIRST` (``pieces``: ``ChunkSpec`` values)."""
    from dataclasses import replace

    return [replace(p, n=RECHECK_FIRST + i) for i, p in enumerate(pieces)]


__all__ = ["PIECE_SCALE", "RECHECK_FIRST", "forget", "needed", "numbered", "recheck_specs", "since"]
