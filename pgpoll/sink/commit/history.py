"""The records after a position, found without reading the whole commit log.

``materialize`` needs, for each typed table, the records after the position
its state holds (a Delta application transaction, an Iceberg summary, a
Parquet marker). Reading every record to find them costs one read per batch
ever committed (one GET each on an object store): 13 s at 1,000 batches on
SeaweedFS, growing every day. Two facts bound it instead:

* version-2 records are ``seq-N.json`` with ``end`` growing with ``seq``,
  so the first record after a position is found by a search over record
  numbers, reading a record per step;
* the commit log's state (its checkpoint and the records after it) knows,
  for each typed table, a record at or after the newest that names it
  (:meth:`pgpoll.sink.commit.checkpoints.LogState.table_index`), so a table
  whose state is at or past that record's ``end`` needs no read at all.

From there, each record names, for each of its typed tables, the newest
earlier record naming it (``prev_tables``; ``prev_rows`` likewise for any
record with rows): :func:`walk` follows that chain back to the position,
reading exactly the records a table applies, not the heartbeats or other
tables' batches between them (an idle night of a 5-minute schedule is 100
heartbeats). Records written before those chains existed are found by a
search instead: it gallops back from the table's newest record (1, 2, 4, ...
records) and then halves, about ``2 log2(k)`` reads for a state ``k``
records behind, then the ``k`` records themselves. Records read
once are cached by the :class:`CommitLog` (they never change), so tables at
the same position share the reads. A full rebuild (no position) reads the
table's whole history, as it must. Outputs with version-1 records (named by
LSN, not number) and logs with a record removed by hand are read the long
way, as before.

Records at or below the retention floor (:mod:`pgpoll.sink.commit.floor`)
were removed by ``pgpoll retain``: nothing here reads below it, and a table
whose position is behind removed records that named it is refused
(:meth:`History.lacks`; exit 2) unless the caller has found a snapshot that
holds them all (:meth:`History.accept`): a state built without them would
silently miss changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pgpoll.errors import ConfigError, SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.checkpoints import LogState
from pgpoll.sink.commit.floor import RetentionFloor, read_floor
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import CommitRecord


class History:
    """A commit log's state, and the records of a table after a position (see the module docstring).

    ``log`` None stands for an output without a commit log (snapshots only).
    """

    def __init__(self, log: CommitLog | None) -> None:
        self.log = log
        self.state = log.state() if log is not None else LogState(head=0, checkpoint=None, tail=())
        self._index = self.state.table_index()
        self._everything: list[CommitRecord] | None = None
        self.floor: RetentionFloor | None = read_floor(log.fs) if log is not None else None
        self._accepted: set[str] = set()

    @property
    def floor_seq(self) -> int:
        """Records at or below this number may have been removed by ``pgpoll retain`` (0: none)."""
        return self.floor.seq if self.floor is not None else 0

    def lacks(self, table: str, position: Lsn | None) -> tuple[int, Lsn, int | None] | None:
        """``(seq, end, xid_max)`` of the removed records naming ``table`` past ``position`` (None: a state from
        the start); None when ``pgpoll retain`` removed none that the table at ``position`` still needs."""
        gone = self.floor.removed(table) if self.floor is not None else None
        if gone is None or (position is not None and gone[1] <= position):
            return None
        return gone

    def accept(self, table: str) -> None:
        """The caller builds ``table`` on a snapshot that holds every removed change of it: read what is left."""
        self._accepted.add(table)

    @property
    def high_water_mark(self) -> Lsn | None:
        """The largest ``end`` of any record (None without records)."""
        return self.state.high_water_mark

    def newest_gap(self) -> CommitRecord | None:
        """The newest gap record (``pgpoll resync``), read by number from the state's index (None: no gap)."""
        seq = self.state.newest_gap()
        if seq == 0 or self.log is None:
            return None
        found = next((r for r in self.state.tail if r.seq == seq), None)
        return found if found is not None else self.log.read(seq)

    def table_dirs(self) -> set[str]:
        """Every typed table directory a record names."""
        return set(self._index)

    def after(self, position: Lsn | None, table: str) -> list[CommitRecord]:
        """The records naming ``table`` whose ``end`` is past ``position`` (None: all of them), in order."""
        found = self._index.get(table)
        if found is None or self.log is None:
            return []
        gone = self.lacks(table, position)
        if gone is not None and table not in self._accepted:
            raise ConfigError(f"{table}: pgpoll retain removed batches of it up to commit-log record {gone[0]} "
                              f"(ending at {gone[1]}), after the position {position or 'of a new state'}",
                              "snapshot the table (pgpoll snapshot --tables) and materialize again")
        floor = self.floor_seq
        last_seq, last_end = found
        if position is not None and Lsn.parse(last_end) <= position:
            return []  # nothing after the state's position names the table: no read
        records = self._all() if self.state.v1_names else None  # named by LSN: no search over numbers
        if records is None:
            try:
                chained = walk(self.log, last_seq, lambda r: position is not None and r.end_lsn <= position,
                               lambda r: r.prev_tables.get(table) if r.prev_tables is not None else None,
                               lambda r: table in r.tables, floor)
                if chained is not None:
                    return chained  # only the table's own records: heartbeats and other tables' skipped
            except SinkError:
                pass  # a record removed by hand: the search below, or the listing, decides
            try:
                first = floor + 1 if position is None else self._first_after(position, last_seq, floor)
                records = self.log.records_after(max(first - 1, floor), replace(self.state, head=last_seq))
            except SinkError:
                records = self._all()
        return [r for r in records if table in r.tables and r.seq > floor and (position is None or r.end_lsn > position)]

    def _all(self) -> list[CommitRecord]:
        if self._everything is None:
            assert self.log is not None
            self._everything = self.log.records()
        return self._everything

    def _end(self, seq: int) -> Lsn:
        assert self.log is not None
        return self.log.read(seq).end_lsn

    def _first_after(self, position: Lsn, last: int, floor: int = 0) -> int:
        """The smallest ``seq`` above ``floor`` whose ``end`` is past ``position``, knowing record ``last``'s is."""
        good, bad, step = last, floor, 1
        while good - step > bad:  # gallop back from ``last``: the states are usually a few records behind
            probe = good - step
            if self._end(probe) > position:
                good, step = probe, step * 2
            else:
                bad = probe
                break
        while good - bad > 1:
            mid = (good + bad) // 2
            if self._end(mid) > position:
                good = mid
            else:
                bad = mid
        return good


def walk(log: CommitLog, start: int, done: Callable[[CommitRecord], bool],
         link: Callable[[CommitRecord], int | None], member: Callable[[CommitRecord], bool],
         floor: int = 0) -> list[CommitRecord] | None:
    """The records of a chain (``prev_rows`` or ``prev_tables``) from ``start`` back to the first ``done`` one
    (excluded) or to the retention ``floor`` (records at or below it are gone), oldest first; None when the chain
    breaks: a record that is not a ``member`` (an index entry that is only an upper bound) or that predates the
    chains (written before 0.3)."""
    out: list[CommitRecord] = []
    seq = start
    while seq > floor:
        record = log.read(seq)
        if done(record):
            break
        if not member(record):
            return None
        out.append(record)
        nxt = link(record)
        if nxt is None or nxt >= seq:
            return None
        seq = nxt
    return out[::-1]
