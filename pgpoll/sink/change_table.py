"""The change log as a Delta table: ``changes/_delta_log/``, one version per committed batch.

The commit log decides what is committed; this is the same fact in the form
every lakehouse reader knows. ``PATH/changes`` is a Delta table partitioned
by ``lsn_range`` (a column Delta and a plain Hive-partitioned read both
show), whose versions are exactly the committed batches: a batch is added only
after its commit-log record has won, as one Delta commit holding its files.
A reader of the Delta table (delta-rs, DuckDB's ``delta_scan``, polars,
Spark with Delta) never sees a staged, losing or half-uploaded batch, on any
store: on an object store, where data files sit at their final keys before
their record exists (:mod:`pgpoll.sink.stores.uploads`), this is the atomic read.

Idempotent and ordered, with no lock: each commit carries the application
transaction :data:`APP_ID` whose version is the record's ``seq``, read back
with ``transaction_version`` before committing; records are added in
``seq`` order, one version each, and a commit is made on the version just
read with no retry (``max_commit_retries=0``): delta-rs's own retry would
not look at application transactions and could add a batch twice. The
snapshot refreshed after a commit may hold other processes' versions too, so
each record is checked against the snapshot its own commit is made on, not
only the first. So of two
processes adding the same record (the run that published it, and another
run's recovery after a crash) one commits and the other re-reads and finds
it done. A record a crash left out of the Delta log is added by the next
recovery (:meth:`ChangeTable.sync`). An existing output written before the
Delta log existed gets a first version listing every committed batch.

Batches without rows (heartbeats) add nothing. Outputs delta-rs cannot open
(``hdfs:``...) have no Delta log; a warning says so once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from pgpoll.errors import SinkError, first_line
from pgpoll.sink import layout
from pgpoll.sink.commit.compactions import APP_ID as COMPACT_APP_ID
from pgpoll.sink.commit.compactions import CompactionRecord
from pgpoll.sink.commit.history import walk
from pgpoll.sink.commit.log import CommitLog, CommitRecord, LogState
from pgpoll.sink.envelope import ENVELOPE_SCHEMA
from pgpoll.sink.stores.local_files import local_path
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.sink")

APP_ID = "pgpoll:changes"
"""The application transaction of pgpoll's commits to ``changes/`` (its version: the newest record added)."""
PARTITION_COLUMN = "lsn_range"
TABLE_SCHEMA = ENVELOPE_SCHEMA.append(pa.field(PARTITION_COLUMN, pa.string()))
"""The Delta schema: the envelope's columns and the partition column (as a Hive-partitioned read shows it)."""
_ATTEMPTS = 20
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
"""A checkpoint every 10 versions (Delta's default is 100): opening the table reads its newest checkpoint and at
most 10 commit files after it, not 100 (on an object store each is a request, at every start of a run)."""


def delta_location(fs: OutputFs, *parts: str) -> tuple[str, dict[str, str] | None] | None:
    """Where delta-rs finds ``fs.path(*parts)`` and the storage options it needs (None: delta-rs cannot open it)."""
    path = fs.path(*parts)
    local = local_path(path)
    if local is not None:
        return local, None
    location = getattr(fs, "location", None)
    if location is not None:
        return path, location.delta_options()
    return None


class ChangeTable:
    """The Delta table over one output's ``changes/`` (see the module docstring)."""

    def __init__(self, fs: OutputFs) -> None:
        self.fs = fs
        found = delta_location(fs, layout.CHANGES)
        self.uri: str | None = found[0] if found is not None else None
        self.options: dict[str, str] | None = found[1] if found is not None else None
        self._table: Any = None
        self._done: int | None = None  # the newest record known to be in the Delta log
        if self.uri is None:
            log.warning("%s: delta-rs cannot open this store, so changes/ gets no Delta log (read it through the "
                        "commit log: pgpoll.reader)", fs.root)

    @property
    def enabled(self) -> bool:
        """False for outputs delta-rs cannot open."""
        return self.uri is not None

    def _load(self) -> Any:
        """The table at its newest version (None: no table yet)."""
        from pgpoll.sink.stores.object_store import retrying

        try:
            return retrying(f"read {self.uri}/_delta_log", self._load_once, store="the change log's Delta table")
        except Exception as exc:
            self._table = None
            raise SinkError(f"cannot read the change log's Delta table {self.uri}: {first_line(exc)}",
                            "check that the output is reachable; the next run completes the Delta log") from None

    def _load_once(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri or "", storage_options=self.options)
        except TableNotFoundError:
            return None
        return self._table

    def added(self) -> int:
        """The newest record in the Delta log (0: none)."""
        table = self._load()
        done = table.transaction_version(APP_ID) if table is not None else None
        self._done = int(done) if done is not None else 0
        return self._done

    def sync(self, commit_log: CommitLog, state: LogState | None = None) -> list[int]:
        """Add every committed record the Delta log lacks, in order; returns the records added by this call.

        Every record up to ``state.head`` must have its files in place: the
        caller has finished their moves (recovery, or the publisher after its own).
        """
        if not self.enabled:
            return []
        state = state or commit_log.state()
        newest = state.newest_data()  # heartbeats after it add nothing: never read them
        if self._done is not None and self._done >= newest:
            return []
        added: list[int] = []
        for _attempt in range(_ATTEMPTS):
            done = self.added()
            if done >= newest:
                return added
            todo = _lacking(commit_log, state, done, newest)
            if not todo:
                return added
            todo = [self._sized(r) for r in todo]
            try:
                added += self._commit(todo, first=self._table is None)
            except _LostError:
                continue  # another process added something meanwhile: read again
            except SinkError as exc:
                from pgpoll.sink.stores.object_store import transient

                if not transient(exc):
                    raise
                log.warning("%s (retrying)", exc.message)
                self._table = None
                time.sleep(1.0)
                continue
        raise SinkError(f"could not add the committed batches to {self.uri} after {_ATTEMPTS} attempts",
                        "check for other writers of changes/_delta_log; the next run completes it")

    def compacted(self) -> int:
        """The newest compaction record in the Delta log (0: none; :mod:`pgpoll.sink.commit.compactions`)."""
        table = self._load()
        return int(table.transaction_version(COMPACT_APP_ID) or 0) if table is not None else 0

    def apply_compaction(self, record: CompactionRecord) -> bool:
        """Compaction record ``record`` as one Delta version: the files its merges replaced removed, the merged
        files added, all with ``dataChange`` false (the table's rows are the same), under the application
        transaction ``pgpoll:compact`` whose version is the record's number; False when it is there already.

        The batches the merges cover must be in the Delta log (:meth:`sync` first) and every earlier compaction
        record applied: a merge can replace an earlier merge's files. Checked and committed on one snapshot
        with no retry, as :meth:`sync` does, so two processes never apply a record twice.
        """
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

        for _attempt in range(_ATTEMPTS):
            table = self._load()
            done = int(table.transaction_version(COMPACT_APP_ID) or 0) if table is not None else 0
            if table is None or done >= record.seq:
                return False
            if done != record.seq - 1:
                raise SinkError(f"compaction record {record.seq} cannot be added to {self.uri}: record {done + 1} "
                                "is not in its Delta log yet", "rerun pgpoll compact: it adds them in order")
            now = int(time.time() * 1000)
            actions: list[Any] = [
                RemoveAction(f"{partition}/{name}", False, now, int(size), {PARTITION_COLUMN: partition.split("=", 1)[1]})
                for partition, files in sorted(record.removed.items()) for name, size in sorted(files.items())]
            for merge in record.made_merges():
                stats = json.dumps({"numRecords": merge.rows}) if len(merge.files) == 1 else "{}"
                actions += [AddAction(f"{merge.partition}/{name}", int(size),
                                      {PARTITION_COLUMN: merge.partition.split("=", 1)[1]}, now, False, stats)
                            for name, size in sorted(merge.files.items())]
            properties = CommitProperties(app_transactions=[Transaction(COMPACT_APP_ID, record.seq)], max_commit_retries=0,
                                          custom_metadata={"pgpoll": json.dumps({"compaction": record.seq})})
            try:
                table.create_write_transaction(actions, "append", Schema.from_arrow(TABLE_SCHEMA),
                                               partition_by=[PARTITION_COLUMN], commit_properties=properties)
            except CommitFailedError:
                self._table = None  # another process committed meanwhile: read again
                continue
            except Exception as exc:
                raise SinkError(f"cannot add compaction record {record.seq} to {self.uri}: {_detail(exc)}",
                                "check that the output is writable; the next pgpoll compact adds it") from None
            return True
        raise SinkError(f"could not add compaction record {record.seq} to {self.uri} after {_ATTEMPTS} attempts",
                        "check for other writers of changes/_delta_log; the next pgpoll compact adds it")

    def _sized(self, record: CommitRecord) -> CommitRecord:
        """``record`` with its files' sizes (records of early versions have none: the partition is listed)."""
        if record.file_sizes and all(name in record.file_sizes for name in record.files):
            return record
        assert record.partition is not None
        listed = {n: size for n, is_dir, size in self.fs.list(self.fs.path(layout.CHANGES, record.partition)) if not is_dir}
        return replace(record, file_sizes={n: listed[n] for n in record.files if n in listed},
                       files=[n for n in record.files if n in listed])

    def _commit(self, todo: Sequence[CommitRecord], *, first: bool) -> list[int]:
        """Commit ``todo`` (one version each; a new table gets them all in its first version)."""
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import CommitProperties, Transaction, create_table_with_add_actions

        schema = Schema.from_arrow(TABLE_SCHEMA)
        done: list[int] = []
        try:
            if first:
                properties = CommitProperties(app_transactions=[Transaction(APP_ID, todo[-1].seq)], max_commit_retries=0,
                                              custom_metadata={"pgpoll": json.dumps({"records": len(todo)})})
                create_table_with_add_actions(self.uri or "", schema, [a for r in todo for a in _adds(r)], mode="error",
                                              partition_by=[PARTITION_COLUMN], storage_options=self.options,
                                              commit_properties=properties, configuration=TABLE_CONFIGURATION)
                self._done = todo[-1].seq
                return [r.seq for r in todo]
            for record in todo:
                # The snapshot this commit is made on must not hold the record already. The first one is the
                # snapshot sync() read it from; every later one is the snapshot refreshed after our previous
                # commit, which may also hold versions another process added since (the next records): then
                # max_commit_retries=0 does not help, the commit is made on a current snapshot and would add the
                # record a second time. Stop and let sync() read again instead.
                if int(self._table.transaction_version(APP_ID) or 0) >= record.seq:
                    return done
                properties = CommitProperties(app_transactions=[Transaction(APP_ID, record.seq)], max_commit_retries=0,
                                              custom_metadata={"pgpoll": json.dumps({"seq": record.seq, "run": record.run})})
                self._table.create_write_transaction(_adds(record), "append", schema, partition_by=[PARTITION_COLUMN],
                                                     commit_properties=properties)
                self._done = record.seq
                done.append(record.seq)
                self._table.update_incremental()
        except CommitFailedError:
            self._table = None
            raise _LostError() from None
        except SinkError:
            raise
        except Exception as exc:
            if first and "already exists" in str(exc).lower():
                self._table = None
                raise _LostError() from None
            raise SinkError(f"cannot add batches to the change log's Delta table {self.uri}: {_detail(exc)}",
                            "check that the output is writable; the next run completes the Delta log") from None
        return done


def _detail(exc: BaseException) -> str:
    """An error's first line, and the status a store answered when the first line does not say it."""
    text = str(exc)
    line = first_line(exc)
    status = next((w for w in ("503", "500", "502", "504", "429", "SlowDown", "timed out") if w in text and w not in line), None)
    return f"{line} ({status})" if status else line


class _LostError(Exception):
    """Another process committed to the Delta log first."""


def _adds(record: CommitRecord) -> list[Any]:
    """The Delta add actions of a record's envelope files (paths relative to ``changes/``)."""
    from deltalake.transaction import AddAction

    assert record.partition is not None
    value = record.partition.split("=", 1)[1]
    now = int(time.time() * 1000)
    sizes = dict(record.file_sizes)
    one = len(record.files) == 1
    return [AddAction(f"{record.partition}/{name}", int(sizes.get(name, 0)), {PARTITION_COLUMN: value}, now, True,
                      json.dumps({"numRecords": record.rows}) if one else "{}")
            for name in record.files]


def _lacking(commit_log: CommitLog, state: LogState, done: int, newest: int) -> list[CommitRecord]:
    """The records with rows after ``done`` up to ``newest``: back along ``prev_rows`` (heartbeats never read),
    or read by name where records predate that chain."""
    try:
        chained = walk(commit_log, newest, lambda r: r.seq <= done, lambda r: r.prev_rows,
                       lambda r: r.partition is not None)
    except SinkError:
        chained = None  # a record removed by hand: read by name, or listed
    if chained is not None:
        return chained
    return [r for r in commit_log.records_after(done, replace(state, head=newest)) if r.partition]


def committed_files(fs: OutputFs) -> list[tuple[str, str, int]]:
    """``(partition, file name, size)`` of every committed batch's envelope files, in commit-log order.

    From the Delta log (a bounded read: its checkpoint and the versions after
    it), plus the records a crash left out of it; from the commit log alone
    where there is no Delta log. Never a staged, losing or unfinished batch.
    """
    import pyarrow as pa

    commit_log = CommitLog(fs)
    table = ChangeTable(fs)
    found: list[tuple[str, str, int]] = []
    done = 0
    loaded = table._load() if table.enabled else None
    if loaded is not None:
        done = int(loaded.transaction_version(APP_ID) or 0)
        actions = pa.table(loaded.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
        for action in actions:
            partition, _sep, name = str(action["path"]).partition("/")
            found.append((partition, name, int(action["size_bytes"])))
        found.sort()
    state = commit_log.state()
    for record in _lacking(commit_log, state, done, max(done, state.newest_data())):
        if record.partition:
            sized = table._sized(record)
            found += [(record.partition, name, int(sized.file_sizes.get(name, 0))) for name in sized.files]
    return found
