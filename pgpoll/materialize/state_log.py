"""The Parquet state's own record log: one publisher per state of a table, even when the lease fails.

The destination's lease (:mod:`pgpoll.materialize.dest_lease`) is the fast
answer; a run that stalled past its lease could otherwise swap its directory
over a newer state. The guarantee is a compare-and-set on a numbered record
per table, as the commit log does for batches (:mod:`pgpoll.sink.commit.log`).
Layout under DEST::

    <dir>/                                     the state readers read; its _pgpoll_state.json has "seq"
    <dir>.materializing-<seq>-<run>/           a run's new state: being written, or published, not yet in place
    _pgpoll_state/<dir>/seq-<16 digits>.json   state record <seq>: who published it, which directory holds it

(``<dir>`` is the table's ``<schema>.<table>`` directory; ``_pgpoll_state``
starts with ``_``, so it can be no table's directory, and Spark and pyarrow
skip it as hidden when DEST itself is read as a dataset.)

**The rule.**

1. A run *pins* the table's head record (the largest ``seq``; 0 when there is
   none, e.g. a DEST written by an older pgpoll) when it reads the state
   (:meth:`StateLog.pin`), after finishing the head's publish if a crashed
   run left it unfinished (step 5).
2. It writes its new state into ``<dir>.materializing-<head+1>-<run>/``, whose
   marker carries ``seq`` head+1.
3. It *publishes* by creating record head+1 exclusively
   (:meth:`OutputFs.create_exclusive`). Losing means another run published
   since the pin: this run removes its directory and fails (exit 5, naming
   the other run), having changed nothing.
4. Only the winner, and only after its record exists, swaps: ``<dir>`` is
   renamed aside, the new directory renamed to ``<dir>``, the old one deleted.
   So ``<dir>`` never holds a state that no record names, and readers find
   the old state, for a moment none, then the new one; never a mix (on stores
   whose directory rename is atomic: local, ``file:``, HDFS; on object stores
   a rename is a copy and a delete).
5. A crash between the record and the end of the swap leaves the head's
   directory in place: the clean-up at the start of a run removes only
   directories whose ``seq`` is below the head, or equal to it and not the
   one the head record names (their writers lost, or will lose, step 3).
   The next run finishes the swap when it pins (:meth:`StateLog.finish` is
   idempotent: done once ``<dir>``'s marker has the record's ``seq``).
6. A head whose directory is gone (removed by hand) leaves ``<dir>`` at an
   older state with its own position; the next run builds on that (a state
   at any position plus the later changes gives the same result) or, with
   no state, rebuilds.

With a broken lease two runs can still finish the same publish at once; the
worst outcome is no ``<dir>`` until the next run rebuilds it, never a wrong one.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.sink.stores.filesystem import OutputFs

log = logging.getLogger("pgpoll.materialize")

STATE_FILE = "_pgpoll_state.json"
"""The marker beside a state's data: position, schema id, rows and, since the record log, ``seq``."""
SCRATCH = ".materializing-"
"""Between a table's directory name and ``<seq>-<run>`` in the name of a state being written (not hidden:
Spark would not list a directory starting with ``_``)."""
LOG_DIR = "_pgpoll_state"
FORMAT = 1

_RECORD = re.compile(r"^seq-([0-9]{16})\.json$")
_SCRATCH_TAIL = re.compile(r"^([0-9]+)-([0-9A-Za-z-]+)$")


def record_name(seq: int) -> str:
    """The file name of state record ``seq``."""
    return f"seq-{seq:016d}.json"


def scratch_name(table_dir: str, seq: int, run: str) -> str:
    """The directory a run writes state ``seq`` of ``table_dir`` into (a sibling of the table's directory)."""
    return f"{table_dir}{SCRATCH}{seq}-{run}"


def parse_scratch_name(name: str) -> tuple[str, int | None] | None:
    """``(table dir, seq)`` of a scratch directory name (seq None: written by a pgpoll before the record log);
    None when ``name`` is no scratch directory."""
    table_dir, sep, tail = name.rpartition(SCRATCH)
    if not sep or not table_dir:
        return None
    m = _SCRATCH_TAIL.match(tail)
    return (table_dir, int(m.group(1))) if m else (table_dir, None)


@dataclass(frozen=True)
class StateRecord:
    """State record ``seq`` of one table: ``scratch`` (a directory under DEST) holds that state until it is
    swapped in; ``state`` is its marker (position, schema id, rows...)."""

    seq: int
    dir: str
    scratch: str
    run: str
    state: Mapping[str, Any]
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    version: int = FORMAT

    def to_json(self) -> str:
        """The record as one JSON document."""
        out = asdict(self)
        out["state"] = dict(self.state)
        return json.dumps(out, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StateRecord:
        """Parse :meth:`to_json`'s output (unknown keys ignored); ValueError when it is not a record."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):
            raise ValueError("not a state record")
        return cls(seq=int(data["seq"]), dir=str(data["dir"]), scratch=str(data["scratch"]), run=str(data["run"]),
                   state=data["state"], created_at=str(data.get("created_at", "")), version=int(data.get("version", 1)))


class StateLog:
    """The record log of one table's Parquet state under DEST (see the module docstring)."""

    def __init__(self, fs: OutputFs, table_dir: str) -> None:
        self.fs = fs
        self.table_dir = table_dir
        self.dir = fs.path(LOG_DIR, table_dir)

    def head(self) -> int:
        """The largest record number (0: no record yet)."""
        seqs = [int(m.group(1)) for n, is_dir, _ in self.fs.list(self.dir) if not is_dir and (m := _RECORD.match(n))]
        return max(seqs, default=0)

    def record(self, seq: int) -> StateRecord | None:
        """Record ``seq`` (None when absent); SinkError when it is unreadable."""
        where = f"{self.dir}/{record_name(seq)}"
        if seq < 1 or not self.fs.exists(where):
            return None
        try:
            return StateRecord.from_json(self.fs.read_text(where))
        except (ValueError, KeyError, TypeError) as exc:
            raise SinkError(f"state record {where} is unreadable: {exc}",
                            "remove it (the next materialize rebuilds the table's state if needed)") from None

    def marker_seq(self, directory: str | None = None) -> int | None:
        """The ``seq`` in the marker of ``directory`` (default: the table's); None without a readable marker
        (0 for one written before the record log)."""
        where = self.fs.path(directory or self.table_dir, STATE_FILE)
        try:
            if not self.fs.exists(where):
                return None
            data = json.loads(self.fs.read_text(where))
            return int(data.get("seq", 0)) if isinstance(data, dict) else None
        except (SinkError, ValueError, TypeError):
            return None

    def pin(self) -> int:
        """The head this run builds on, after finishing the head's publish if a crashed run left it undone."""
        head = self.head()
        record = self.record(head)
        if record is not None:
            self.finish(record)
        return head

    def publish(self, record: StateRecord) -> None:
        """The compare-and-set: create record ``record.seq``; SinkError (exit 5) naming the winner when it exists.

        On any failure the caller removes ``record.scratch`` only if
        :meth:`owns` says the record is not this run's.
        """
        self.fs.mkdirs(self.dir)
        if not self.fs.create_exclusive(f"{self.dir}/{record_name(record.seq)}", record.to_json()):
            raise self.conflict(record.seq)

    def commit(self, record: StateRecord) -> None:
        """Publish ``record`` (:meth:`publish`) and swap its directory in (:meth:`finish`).

        A run that loses, or fails before its record is known to exist,
        removes its directory; one whose record exists leaves it for the next
        run to swap in.
        """
        try:
            self.publish(record)
        except BaseException:
            if not self.owns(record):
                self.fs.delete(self.fs.path(record.scratch))
            raise
        if not self.finish(record):
            raise SinkError(f"{self.fs.path(self.table_dir)}: the new state {record.scratch} vanished before it was "
                            "swapped in", "find out what else removes files under the destination; rerun pgpoll materialize")

    def check_pin(self, pinned: int) -> None:
        """Raise :meth:`conflict` when another run published after state ``pinned`` (e.g. after this run's
        Spark job failed because that run's swap removed the files it read)."""
        if self.head() > pinned:
            raise self.conflict(pinned + 1)

    def conflict(self, seq: int) -> SinkError:
        """The error of a run that pinned state ``seq - 1`` and found record ``seq`` taken (exit 5)."""
        try:
            other = self.record(seq)
        except SinkError:
            other = None
        who = f"run {other.run} (position {other.state.get('position', '?')}, at {other.created_at})" if other else \
            "another run"
        return SinkError(
            f"{self.fs.path(self.table_dir)}: state {seq} was published by materialize {who} after this run "
            f"read state {seq - 1}; not published over it",
            "one materialize at a time per --to DEST: find the other writer, then rerun pgpoll materialize "
            "(it builds on the newest state)",
        )

    def owns(self, record: StateRecord) -> bool:
        """True when record ``record.seq`` exists and names ``record``'s directory (the publish landed)."""
        try:
            found = self.record(record.seq)
        except SinkError:
            return False
        return found is not None and found.scratch == record.scratch

    def finish(self, record: StateRecord) -> bool:
        """Swap the published state ``record`` into the table's directory unless that is done; idempotent.

        Returns True when the directory holds that state (or a newer one)
        afterwards, False when the record's directory is gone (the table's
        directory keeps what it has: an older state, or none).
        """
        target = self.fs.path(self.table_dir)
        if (self.marker_seq() or 0) >= record.seq:
            return True
        scratch = self.fs.path(record.scratch)
        if self.marker_seq(record.scratch) != record.seq:
            log.warning("%s: the directory of published state %d (%s) is gone; keeping the state in place",
                        target, record.seq, record.scratch)
            return False
        aside = self.fs.path(scratch_name(self.table_dir, record.seq - 1, f"{record.run}-old"))
        if self.fs.exists(target):
            self.fs.delete(aside)  # left by an earlier attempt at this very swap
            self.fs.rename(target, aside)
        try:
            self.fs.rename(scratch, target)
        except SinkError:
            if (self.marker_seq() or 0) >= record.seq:  # another run finished it meanwhile
                return True
            raise
        self.fs.delete(aside)
        log.info("%s: state %d of run %s in place", target, record.seq, record.run)
        return True


def stale_scratch(fs: OutputFs, name: str) -> bool:
    """True when the DEST entry ``name`` is a state directory no run will publish or swap in any more.

    Kept: one whose ``seq`` is above its table's head (a live run may publish
    it) and the one the head record names (a crashed run's publish, finished
    by the next pin). Directories without a ``seq`` (older pgpoll) are stale.
    """
    parsed = parse_scratch_name(name)
    if parsed is None:
        return False
    table_dir, seq = parsed
    if seq is None:
        return True
    states = StateLog(fs, table_dir)
    head = states.head()
    if seq > head:
        return False
    if seq < head:
        return True
    try:
        record = states.record(head)
    except SinkError:
        return False
    return record is None or record.scratch != name
