"""pgpoll's commit log: the one owner of its format, read and written over any :class:`OutputFs`.

A batch counts as committed when its record exists. The high-water mark —
the largest ``end`` of any record — is the LSN up to which the output holds
every change; the slot is re-advanced to it at the start of each run, and no
change with a ``commit_lsn`` at or below it is ever written again.

Its files under ``PATH/_pgpoll/``: the records, one per batch, numbered and
fenced (:mod:`pgpoll.sink.commit.records`), and the checkpoints that fold
them with the pointer to the newest (:mod:`pgpoll.sink.commit.checkpoints`);
this module reads them at start-up and appends, and every name of those two
modules is importable from here as well.

**Start-up reads a bounded set of files, however long the log.** Listing
``commits/`` costs one entry per batch ever committed (through Hadoop's
``FileSystem`` over py4j about 0.5 ms an entry: 5 s for 10,000 batches, paid
at every start and every plan). So the newest checkpoint's number is kept in
``_pgpoll/newest-checkpoint.json`` (the *pointer*, ``{"seq": N, "clean": ...}``)
and start-up reads the pointer, that checkpoint, and then records N+1, N+2,
... one by one until one is absent: about ``CHECKPOINT_EVERY`` files at most.
The pointer is only a hint, rewritten after each checkpoint; every way it can
be wrong falls back to listing, which stays the reference:

* absent, unreadable, or naming a checkpoint that is unreadable or folds a
  record that is gone (removed by hand): list;
* stale (a newer checkpoint exists): correct anyway — any checkpoint at or
  below the head plus the records after it is the whole log — just a longer
  tail, until the next checkpoint rewrites it;
* the checkpoint's own record N is gone: list. ``pgpoll retain`` removes
  records only below a checkpoint it writes at the head first
  (:mod:`pgpoll.sink.commit.floor`), so the newest checkpoint's record is
  never one it removed; a pointer left at an older checkpoint whose record it
  removed is stale, and trusting it would take the first removed record
  after it for the head: the listing finds the newest checkpoint instead;
* the first absent record N+k is followed by N+k+1 (a record removed by hand,
  not a race: the probe re-checks N+k first): list, so the head is the
  largest ``seq`` as before;
* the checkpoint does not say it has no version-1 records before it (written
  by an older pgpoll, ``v1_records`` None) or it has some: list. Outputs with
  version-1 records are read exactly as before; only outputs written by this
  version alone take the short path. (Once a version-2 pgpoll has written
  an output, a version-1 pgpoll must not write to it again: it ignores the
  fence; that mix was never supported.)

``clean`` records that recovery's full pass over ``changes/`` and ``tables/``
(:mod:`pgpoll.sink.commit.recovery`, step 3) has run on this output and left no
partition that no record names; it only ever goes from false to true.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.checkpoints import CHECKPOINT_EVERY, KEEP_CHECKPOINTS, POINTER, Checkpoint, LogState
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.records import GAP_VERSION, VERSION, CommitRecord, parse_timestamp, record_name, utc_now
from pgpoll.sink.stores.filesystem import OutputFs, open_output

__all__ = [
    "CHECKPOINT_EVERY", "KEEP_CHECKPOINTS", "POINTER", "VERSION", "Checkpoint", "CommitLog", "CommitLogSummary",
    "CommitRecord", "LogState", "record_name", "summarize",
]

log = logging.getLogger("pgpoll.sink")

_V1_NAME = re.compile(r"^[0-9A-F]{16}\.json$")
_V2_NAME = re.compile(r"^seq-([0-9]{16})\.json$")


class CommitLog:
    """The commit log of one output path: reading it at start-up, and the compare-and-set append.

    Records and checkpoints never change once written, so each is read at
    most once per instance; the records after the checkpoint the pointer
    names are found by probing their names (see the module docstring).
    """

    def __init__(self, fs: OutputFs) -> None:
        self.fs = fs
        self.dir = fs.path(layout.COMMITS)
        self.checkpoint_dir = fs.path(layout.CHECKPOINTS)
        self.pointer_path = fs.path(layout.META, POINTER)
        self._records: dict[str, CommitRecord] = {}
        self._checkpoints: dict[int, Checkpoint] = {}
        self._base: Checkpoint | None = None  # the checkpoint probing starts from (None: list)
        self._pointer_read = False
        self.clean = False
        """True once this output's full pass over partitions is known to have run (see the module docstring)."""
        self.last_state: LogState | None = None

    def _names(self) -> tuple[list[str], dict[int, str]]:
        """Version-1 names in LSN order, and version-2 names by seq (files only; ``_tmp`` files skipped)."""
        v1: list[str] = []
        v2: dict[int, str] = {}
        for name, is_dir, _size in self.fs.list(self.dir):
            if is_dir:
                continue
            m = _V2_NAME.match(name)
            if m:
                v2[int(m.group(1))] = name
            elif _V1_NAME.match(name):
                v1.append(name)
        return sorted(v1), v2

    def head(self) -> int:
        """The last record's ``seq`` (0 for a new output), from names alone (probed, or listed)."""
        base = self._usable_base()
        if base is not None:
            seq = max(base.seq, max((r.seq for r in self._records.values() if r.version >= 2), default=0))
            found = self._probe(seq, read=False)
            if found is not None:
                return found[0]
        v1, v2 = self._names()
        return max(v2) if v2 else len(v1)

    def _read(self, name: str, seq: int) -> CommitRecord:
        cached = self._records.get(name)
        if cached is None:
            where = f"{self.dir}/{name}"
            cached = CommitRecord.parse(self.fs.read_text(where), where, name)
            if cached.version < 2:
                cached = replace(cached, seq=seq)
            self._records[name] = cached
        return cached

    def _load_checkpoint(self, seq: int) -> Checkpoint | None:
        """Checkpoint ``seq``, or None when it is absent or unreadable."""
        if seq not in self._checkpoints:
            where = f"{self.checkpoint_dir}/{record_name(seq)}"
            try:
                self._checkpoints[seq] = Checkpoint.from_json(self.fs.read_text(where))
            except SinkError:
                return None  # absent (a pointer that is wrong): the caller lists
            except (ValueError, TypeError) as exc:
                log.warning("checkpoint %s is unreadable (%s); using an older one", where, exc)
                return None
        return self._checkpoints[seq]

    def _checkpoint(self, limit: int) -> Checkpoint | None:
        """The newest readable checkpoint at or below ``limit`` (the checkpoints listed)."""
        seqs = sorted((int(m.group(1)) for n, d, _s in self.fs.list(self.checkpoint_dir)
                       if not d and (m := _V2_NAME.match(n))), reverse=True)
        for seq in seqs:
            if seq > limit:
                continue  # folds a record that is gone (removed by hand): ignore it
            cp = self._load_checkpoint(seq)
            if cp is not None:
                return cp
        return None

    def read_pointer(self) -> dict[str, Any] | None:
        """The pointer's content (None when absent or unreadable); ``clean`` is taken over from it."""
        try:
            found = self.fs.read_tagged(self.pointer_path)
            data = json.loads(found[0]) if found is not None else None
        except (SinkError, ValueError):
            data = None  # being rewritten (Hadoop's replace is delete, then rename), or damaged: list
        if not isinstance(data, dict) or not isinstance(data.get("seq"), int):
            return None
        self.clean = self.clean or data.get("clean") is True
        return data

    def _usable_base(self) -> Checkpoint | None:
        """The checkpoint to probe from: the pointer's, read once per instance (None: list)."""
        if not self._pointer_read:
            self._pointer_read = True
            pointer = self.read_pointer()
            cp = self._load_checkpoint(int(pointer["seq"])) if pointer is not None else None
            if cp is not None and cp.v1_records == 0 and cp.seq >= 1:
                self._base = cp
        return self._base

    def _probe(self, after: int, *, read: bool) -> tuple[int, list[CommitRecord]] | None:
        """Records ``after``+1, +2, ... up to the first absent one: ``(head, records read)``; None: list instead.

        ``after`` must exist (None when it is gone); an absent record followed
        by a present one is a hole (removed by hand): None.
        """
        if record_name(after) not in self._records and not self.fs.exists(self.record_path(after)):
            return None
        seq, records = after, []
        while True:
            nxt = seq + 1
            name = record_name(nxt)
            if name in self._records or self.fs.exists(self.record_path(nxt)):
                if read:
                    records.append(self._read(name, nxt))
                seq = nxt
                continue
            if not self.fs.exists(self.record_path(nxt + 1)):
                return seq, records
            if not self.fs.exists(self.record_path(nxt)):  # not created meanwhile by a live run: a hole
                return None

    def state(self) -> LogState:
        """The newest checkpoint (as far as known) and every record after it: a bounded read when the pointer holds."""
        base = self._usable_base()
        if base is not None:
            probed = self._probe(base.seq, read=True)
            if probed is not None:
                self.last_state = LogState(head=probed[0], checkpoint=base, tail=tuple(probed[1]), listed=False)
                return self.last_state
            self._base = None  # a hole, or the checkpoint's record is gone: the listing decides from now on
        v1, v2 = self._names()
        head = max(v2) if v2 else len(v1)
        cp = self._checkpoint(head)
        after = cp.seq if cp else 0
        tail = [self._read(n, i) for i, n in enumerate(v1, start=1) if i > after]
        tail += [self._read(v2[s], s) for s in sorted(v2) if s > after]
        if cp is not None and cp.v1_records == 0 and not v1:
            self._base = cp  # the next calls of this instance probe from it; mark_clean can point at it
        self.last_state = LogState(head=head, checkpoint=cp, tail=tuple(tail), v1_names=tuple(v1))
        return self.last_state

    def needs_scan(self) -> bool:
        """Whether recovery's full pass over the partitions must run at start (see the module docstring)."""
        return self._usable_base() is None or not self.clean

    def records(self) -> list[CommitRecord]:
        """Every record (version 1 and 2), in ``seq`` order: the whole history, read file by file."""
        return list(self.iter_records())

    def iter_records(self) -> Iterator[CommitRecord]:
        """Every record, in ``seq`` order, each read when it is asked for (``batches --all`` streams them)."""
        v1, v2 = self._names()
        for i, name in enumerate(v1, start=1):
            yield self._read(name, i)
        for seq in sorted(v2):
            yield self._read(v2[seq], seq)

    def read(self, seq: int) -> CommitRecord:
        """Version-2 record ``seq``, by its name (no listing); :class:`SinkError` when it is absent."""
        return self._read(record_name(seq), seq)

    def records_after(self, after: int, state: LogState | None = None) -> list[CommitRecord]:
        """Records ``after``+1 .. ``state``'s head, in order, read by name: one read a record, whatever the history.

        Records ``pgpoll retain`` removed (at or below the retention floor,
        :mod:`pgpoll.sink.commit.floor`) are left out: the rest is read by name
        from the floor up. An output with version-1 records, or a record
        missing in that range (removed by hand), is read the long way
        (:meth:`records`).
        """
        state = state or self.state()
        tail = {r.seq: r for r in state.tail}
        if not state.v1_names:
            try:
                return [tail.get(seq) or self.read(seq) for seq in range(max(after, 0) + 1, state.head + 1)]
            except SinkError:
                floor = read_floor(self.fs)  # only now: a read that found a record gone
                if floor is not None and floor.seq > after:
                    return self.records_after(floor.seq, state)
        return [r for r in self.records() if after < r.seq <= state.head]

    def partitions(self, state: LogState) -> list[tuple[str, list[str]]]:
        """``(partition, typed tables)`` of every record that wrote rows, in order: the whole history."""
        return self.folded_partitions(state) + [(r.partition, list(r.tables)) for r in state.tail if r.partition]

    def folded_partitions(self, state: LogState) -> list[tuple[str, list[str]]]:
        """``(partition, typed tables)`` of the records ``state``'s checkpoint folds, in order.

        From the checkpoint's list when it has one (written before 0.3), from
        the records otherwise: only recovery's full pass and plain reads of a
        local output need it, and both are as long as the history anyway.
        """
        cp = state.checkpoint
        if cp is None:
            return []
        if cp.partitions is not None:
            return [(str(p[0]), list(p[1])) for p in cp.partitions]
        floor = read_floor(self.fs)  # records below it were removed by pgpoll retain, with their partitions
        folded = self.records_after(floor.seq if floor is not None else 0, replace(state, head=cp.seq, tail=()))
        return [(r.partition, list(r.tables)) for r in folded if r.partition]

    def high_water_mark(self) -> Lsn | None:
        """The largest ``end`` of any record (None for a new output)."""
        return self.state().high_water_mark

    def record_path(self, seq: int) -> str:
        """Where version-2 record ``seq`` lives."""
        return f"{self.dir}/{record_name(seq)}"

    def create(self, record: CommitRecord) -> bool:
        """The compare-and-set: write ``record`` as record ``record.seq`` only if that does not exist yet.

        True when this call created it (the batch is committed); False when
        another run's record has that number (this run lost).
        """
        if record.version != (GAP_VERSION if record.is_gap else VERSION) or record.seq < 1:
            raise ValueError("only version-2 batch and version-3 gap records with a seq are created")
        self.fs.mkdirs(self.dir)
        won = self.fs.create_exclusive(self.record_path(record.seq), record.to_json())
        if won:
            self._records[record_name(record.seq)] = replace(record, name=record_name(record.seq))
        return won

    def write_checkpoint(self, state: LogState, upto: int, run: str | None = None) -> bool:
        """Create the checkpoint of records 1..``upto`` if absent (the caller knows their files are in place).

        Then the pointer names it, when it says there are no version-1 records.
        """
        if state.checkpoint is not None and state.checkpoint.seq >= upto:
            return False
        self.fs.mkdirs(self.checkpoint_dir)
        fold = state.fold(upto, run)
        written = self.fs.create_exclusive(f"{self.checkpoint_dir}/{record_name(upto)}", fold.to_json())
        if written:
            log.info("commit-log checkpoint written over records 1..%d", upto)
            self._checkpoints[upto] = fold
            self._prune_checkpoints()
        cp = self._load_checkpoint(upto)  # this one, or the one another run wrote (never pointed at if unreadable)
        if cp is not None and cp.v1_records == 0:
            if self._base is None or self._base.seq < upto:
                self._base = cp
            self.write_pointer(upto)
        return written

    def _prune_checkpoints(self) -> None:
        """Delete all but the newest :data:`KEEP_CHECKPOINTS` checkpoints (a failure only leaves them for the next).

        The newest ones stay: a reader that was pointed at a deleted one falls
        back to listing (see the module docstring), and an unreadable newest
        one still has older ones behind it.
        """
        try:
            seqs = sorted(int(m.group(1)) for n, d, _s in self.fs.list(self.checkpoint_dir)
                          if not d and (m := _V2_NAME.match(n)))
            for seq in seqs[:-KEEP_CHECKPOINTS]:
                self.fs.delete(f"{self.checkpoint_dir}/{record_name(seq)}")
                self._checkpoints.pop(seq, None)
        except SinkError as exc:
            log.warning("could not delete old commit-log checkpoints: %s", exc.message)

    def mark_clean(self) -> None:
        """Recovery's full pass has run and left no unrecorded partition: say so in the pointer (when there is one)."""
        self.clean = True
        base = self._usable_base()
        if base is not None:
            self.write_pointer(base.seq)

    def write_pointer(self, seq: int) -> None:
        """Point start-up at checkpoint ``seq`` unless it already names a newer one (never unsets ``clean``)."""
        current = self.read_pointer()
        if current is not None and int(current["seq"]) >= seq and (current.get("clean") is True or not self.clean):
            return
        newest = max(seq, int(current["seq"])) if current is not None else seq
        body = {"seq": newest, "clean": self.clean, "version": VERSION, "written_at": utc_now()}
        try:
            self.fs.write_text(self.pointer_path, json.dumps(body, sort_keys=True))
        except SinkError as exc:  # a hint: the next checkpoint writes it again
            log.warning("could not write %s: %s", self.pointer_path, exc.message)


@dataclass(frozen=True)
class CommitLogSummary:
    """What an output's commit log says, for status reports.

    ``high_water_mark`` is the largest ``end`` (where the slot was last
    advanced to); ``last_commit_ts`` is the newest commit time of any change
    written (None until a batch wrote a row); ``slots`` are the slot names the
    records carry (one, unless the output was fed by a recreated slot);
    ``head`` the last record's number; ``fenced`` whether the store publishes
    with an atomic compare-and-set.
    """

    output: str
    records: int
    rows: int
    high_water_mark: Lsn | None
    last_commit_ts: datetime | None
    last_committed_at: datetime | None
    slots: tuple[str, ...]
    head: int = 0
    fenced: bool = True


def summarize(output: str, fs: OutputFs | None = None, commit_log: CommitLog | None = None) -> CommitLogSummary:
    """High-water mark, newest commit time and totals of the commit log under ``output`` (no JVM); ``commit_log``
    when the caller reads more of it (its records are read once)."""
    commit_log = commit_log or CommitLog(fs or open_output(output))
    fs = commit_log.fs
    state = commit_log.state()
    fold = state.fold(state.head)
    return CommitLogSummary(
        output=output,
        records=fold.records,
        rows=fold.rows,
        high_water_mark=state.high_water_mark,
        last_commit_ts=parse_timestamp(fold.last_commit_ts) if fold.last_commit_ts else None,
        last_committed_at=parse_timestamp(fold.last_committed_at) if fold.last_committed_at else None,
        slots=tuple(fold.slots),
        head=state.head,
        fenced=fs.fenced,
    )
