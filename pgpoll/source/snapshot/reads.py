"""Reading a snapshot from the server: preflight, chunk plans, chunk reads, the shared snapshot, the wait.

Why each step is as it is (see POSTGRES-NOTES.md, "Snapshots, visibility and
the change stream"):

* A chunk is read in its own ``REPEATABLE READ READ ONLY`` transaction whose
  first statements take ``ACCESS SHARE`` on the table (TRUNCATE and table
  rewrites are not MVCC-safe: a snapshot older than them sees an empty
  table). The first *query* after the lock takes the transaction's snapshot;
  it also pins the session settings and returns ``pg_current_snapshot()``
  and the table's file node. Materialize applies exactly the changes whose
  transaction that snapshot does not see.
* Rows are fetched here with ``COPY (SELECT ...) TO STDOUT (FORMAT csv)``:
  the server's output functions under the pinned settings, the same text both
  plugins print, at COPY speed, parsed by pyarrow's CSV reader with every
  column a string (an unquoted empty field is NULL, a quoted one ``''``).
  This is the path without ADBC (and for client-side row filters); chunk
  tasks read in binary through ADBC otherwise
  (:mod:`pgpoll.source.snapshot.fetch`, the same transaction).
* Chunk bounds compare the replica-identity key by row comparison (``lo <
  key <= hi``), found by keyset probes. A shared snapshot (one
  ``pg_export_snapshot()`` imported by every chunk) is split by ctid block
  ranges per leaf relation; the last range of a leaf is open.
* Every transaction bounds itself (``statement_timeout``, ``lock_timeout``,
  the exporter's ``idle_in_transaction_session_timeout``); a hot standby is
  refused (its snapshots list no running transaction).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from pgpoll.errors import (
    LockTimeoutError,
    SharedSnapshotLostError,
    SlotInvalidatedError,
    SlotNotFoundError,
    SourceError,
    TableRewrittenError,
    WrongPluginError,
)
from pgpoll.lsn import Lsn
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.server_errors import translate
from pgpoll.source.session import SESSION_SETTINGS, pinned_transaction
from pgpoll.source.snapshot.catalog import SnapshotTable
from pgpoll.source.snapshot.chunks import copy_sql, parse_csv, stream_csv
from pgpoll.source.snapshot.plans import PROBE_TIMEOUT_MS, ChunkSpec, plan_chunks, set_timeout
from pgpoll.xids import Snapshot, parse_snapshot

APPLICATION_NAME = "pgpoll-snapshot"
READ_TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class SourceCheck:
    """What the preflight learnt: the slot's plugin and the server's version number (``150004``)."""

    plugin: str
    server_version: int


_CHECK_SQL = """
SELECT pg_is_in_recovery(), current_setting('server_version_num')::int, current_database()::text,
       s.slot_name IS NOT NULL, s.plugin::text, s.slot_type, s.wal_status, s.database::text
  FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = %s
"""


def check_source(conn: Any, slot: str) -> SourceCheck:
    """Refuse a hot standby, a missing, physical, foreign or lost slot (all exit 4)."""
    try:
        with pinned_transaction(conn) as cur:
            set_timeout(cur, PROBE_TIMEOUT_MS)
            cur.execute(_CHECK_SQL, (slot,))
            recovery, version, dbname, exists, plugin, slot_type, wal_status, slot_db = cur.fetchone()
    except psycopg2.Error as exc:
        raise translate(exc, slot=slot) from None
    if recovery:
        raise SourceError(
            "the server is a hot standby: its snapshots do not list running transactions, "
            "so a snapshot read there cannot be matched with the change stream",
            "run the snapshot with --dsn of the primary and a slot on the primary; the slot and the snapshot must be "
            "on one server (pgpoll cannot yet read a snapshot from the primary for a standby's slot), so an output "
            "captured from a standby's slot holds the changes from the slot's creation on: see the how-to "
            "'Capture from a standby'",
        )
    if not exists:
        raise SlotNotFoundError(f'replication slot "{slot}" does not exist',
                                "create it first: pgpoll slot create NAME --plugin ...")
    if slot_type != "logical":
        raise SourceError(f'replication slot "{slot}" is not a logical slot', "give a logical slot (pgpoll slot list)")
    if slot_db != dbname:
        raise SourceError(f'replication slot "{slot}" was not created in database "{dbname}"',
                          "connect to the slot's database (see the database column of: pgpoll slot list)")
    if wal_status == "lost":
        raise SlotInvalidatedError(
            f'replication slot "{slot}" is lost (wal_status = lost): the changes after a snapshot cannot be read',
            "drop and recreate the slot, start ingest with it, then run the snapshot",
        )
    if plugin not in ("pgoutput", "test_decoding"):
        raise WrongPluginError(f'slot "{slot}" uses plugin {plugin}', "pgpoll reads pgoutput and test_decoding slots")
    return SourceCheck(str(plugin), int(version))


def current_wal_lsn(conn: Any) -> int:
    """``pg_current_wal_lsn()`` as an int."""
    try:
        with pinned_transaction(conn) as cur:
            set_timeout(cur, PROBE_TIMEOUT_MS)
            cur.execute("SELECT pg_current_wal_lsn()::text")
            text = cur.fetchone()[0]
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return int(Lsn.parse(text))


# ---- chunk reads -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkRead:
    """One chunk as read: its snapshot, the table's file node then, the text of every value."""

    snapshot: Snapshot
    relfilenode: int
    texts: pa.Table


# A partitioned table has no storage of its own (pg_relation_filenode is NULL): the sum of its leaves'.
# pg_partition_tree lists nothing for a table outside any partition tree.
FILENODE_SQL = (
    "SELECT COALESCE(pg_relation_filenode(r)::bigint, (SELECT sum(pg_relation_filenode(relid)::bigint) "
    "FROM pg_partition_tree(r) WHERE isleaf), 0)::bigint FROM CAST(%s AS regclass) AS r"
)
# The transaction's first query: it takes the snapshot (after LOCK TABLE), pins the settings
# (set_config(..., true), as pgpoll.source.session does) and returns the snapshot.
_FIRST_QUERY = (
    "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in SESSION_SETTINGS)
    + ", pg_current_snapshot()::text, (" + FILENODE_SQL + ")"
)
_FIRST_PARAMS = tuple(part for item in SESSION_SETTINGS.items() for part in item)


def _begin(cur: Any, *, exported: str | None, lock_timeout_ms: int, statement_timeout_ms: int) -> None:
    cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    if exported is not None:
        try:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (exported,))  # must come before any other statement
        except psycopg2.Error as exc:
            raise SharedSnapshotLostError(
                f"cannot import the shared snapshot {exported}: {translate(exc).message}",
                "its exporting session ended (--shared-snapshot-timeout, or it was terminated): run the same "
                "command again to read the table under a new snapshot",
                sqlstate=exc.pgcode,
            ) from None
    cur.execute("SET LOCAL lock_timeout = %s", (int(lock_timeout_ms),))
    cur.execute("SET LOCAL statement_timeout = %s", (int(statement_timeout_ms),))


def _lock(conn: Any, cur: Any, t: SnapshotTable, lock_timeout_ms: int) -> None:
    """``LOCK TABLE ... IN ACCESS SHARE MODE``; a timeout becomes :class:`LockTimeoutError` naming the blocker."""
    try:
        cur.execute(sql.SQL("LOCK TABLE {}.{} IN ACCESS SHARE MODE").format(
            sql.Identifier(t.schema), sql.Identifier(t.table)))
    except psycopg2.Error as exc:
        if exc.pgcode != "55P03":
            raise
        with contextlib.suppress(psycopg2.Error):
            cur.execute("ROLLBACK")
        raise lock_timeout_error(conn, t, lock_timeout_ms) from None


_BLOCKER_SQL = """
SELECT l.pid, a.application_name, a.xact_start
  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.relation IN (SELECT %s::regclass UNION ALL SELECT relid FROM pg_partition_tree(%s::regclass))
   AND l.mode = 'AccessExclusiveLock' AND l.pid IS DISTINCT FROM pg_backend_pid()
 ORDER BY l.granted DESC, a.xact_start NULLS LAST
 LIMIT 1
"""


def lock_timeout_error(conn: Any, t: SnapshotTable, lock_timeout_ms: int) -> LockTimeoutError:
    """The error for a timed-out lock on ``t``, naming the session that holds (or queues for) the conflicting lock
    (asked on ``conn``, a psycopg2 connection; ``None``: not named)."""
    pid = app = since = None
    with contextlib.suppress(psycopg2.Error, AttributeError), conn.cursor() as cur:
        cur.execute(_BLOCKER_SQL, (t.quoted_name, t.quoted_name))
        row = cur.fetchone()
        if row is not None:
            pid, app, started = row
            since = started.isoformat() if started is not None else None
    who = (f"session pid {pid} (application {app or 'unnamed'!r}, transaction started {since})"
           if pid is not None else "another session (or a prepared transaction)")
    err = LockTimeoutError(
        f"could not lock {t.qualified_name} within {lock_timeout_ms} ms: {who} holds or waits for an "
        "ACCESS EXCLUSIVE lock on it",
        "wait for that transaction (ALTER TABLE, TRUNCATE, VACUUM FULL, LOCK...) to end or end it, or raise "
        "--lock-timeout; finished chunks are kept: run the same command again",
        relation=t.qualified_name,
        sqlstate="55P03",
    )
    err.table, err.blocker_pid, err.blocker_application, err.blocker_since = t.qualified_name, pid, app, since
    return err


@dataclass
class ChunkStream:
    """One chunk being read: its snapshot, the table's file node then, and its columns in batches.

    ``native`` says, per column, whether it was read in binary (an Arrow
    value for :func:`pgpoll.typed.native_values.native_to_typed`) rather than
    as the server's text; empty: every column is text.
    """

    snapshot: Snapshot
    relfilenode: int
    batches: Iterator[pa.RecordBatch]
    native: tuple[bool, ...] = ()


@contextlib.contextmanager
def stream_chunk(
    dsn: str,
    t: SnapshotTable,
    chunk: ChunkSpec,
    *,
    lock_timeout_ms: int,
    exported: str | None = None,
    exported_relfilenode: int | None = None,
    statement_timeout_ms: int = READ_TIMEOUT_MS,
    extra: tuple[str, ...] = (),
) -> Iterator[ChunkStream]:
    """Read one chunk in its own transaction (see the module docstring); one attempt.

    The rows arrive as the server sends them (a few MB of text at a time), so
    a chunk of any size reads in bounded memory; the transaction commits when
    the batches are exhausted, and ends with the ``with`` block in any case.
    ``exported``: the shared snapshot to import (mode shared). Raises
    :class:`LockTimeoutError` when the lock is not granted in time,
    :class:`SharedSnapshotLostError` when the exported snapshot is gone,
    :class:`TableRewrittenError` when, with ``exported``, the table's file
    node is no longer ``exported_relfilenode`` (it was rewritten after the
    shared snapshot: reading through that snapshot would see the new files),
    other server errors translated. ``extra``: more conditions on the rows (SQL text).
    """
    conn = connect(resolve_dsn(dsn), application_name=APPLICATION_NAME, autocommit=True)
    try:
        with conn.cursor() as cur:
            try:
                _begin(cur, exported=exported, lock_timeout_ms=lock_timeout_ms,
                       statement_timeout_ms=statement_timeout_ms)
                _lock(conn, cur, t, lock_timeout_ms)
                cur.execute(_FIRST_QUERY, (*_FIRST_PARAMS, t.quoted_name))
                snapshot_text, relfilenode = cur.fetchone()[-2:]
            except psycopg2.Error as exc:
                raise translate(exc) from None
            if exported_relfilenode is not None and int(relfilenode) != exported_relfilenode:
                raise TableRewrittenError(
                    f"{t.qualified_name} was rewritten (TRUNCATE, VACUUM FULL or a rewriting ALTER TABLE) after "
                    "its shared snapshot was taken",
                    "its read starts again under a new snapshot; if this repeats, run the snapshot when the "
                    "table is not being rewritten",
                    relation=t.qualified_name,
                )
            statement = copy_sql(t, chunk, extra)

            def batches() -> Iterator[pa.RecordBatch]:
                try:
                    yield from stream_csv(lambda sink: cur.copy_expert(statement, sink, size=1 << 20), t.names)
                    cur.execute("COMMIT")
                except psycopg2.Error as exc:
                    raise translate(exc) from None

            yield ChunkStream(parse_snapshot(snapshot_text), int(relfilenode), batches())
    finally:
        with contextlib.suppress(psycopg2.Error):
            conn.close()


def read_chunk(
    dsn: str,
    t: SnapshotTable,
    chunk: ChunkSpec,
    *,
    lock_timeout_ms: int,
    exported: str | None = None,
    exported_relfilenode: int | None = None,
    statement_timeout_ms: int = READ_TIMEOUT_MS,
) -> ChunkRead:
    """:func:`stream_chunk`, read whole into one table (for small chunks and tests)."""
    with stream_chunk(dsn, t, chunk, lock_timeout_ms=lock_timeout_ms, exported=exported,
                      exported_relfilenode=exported_relfilenode, statement_timeout_ms=statement_timeout_ms) as s:
        schema = pa.schema([pa.field(n, pa.string()) for n in t.names])
        texts = pa.Table.from_batches(list(s.batches), schema=schema)
    return ChunkRead(s.snapshot, s.relfilenode, texts)


# ---- the shared snapshot -----------------------------------------------------------------


_IN_TRANSACTION = (psycopg2.extensions.TRANSACTION_STATUS_INTRANS, psycopg2.extensions.TRANSACTION_STATUS_INERROR)


class SharedSnapshot:
    """An exported snapshot of one table, open for as long as the ``with`` block (at most ``timeout_s``).

    The exporter takes ``ACCESS SHARE`` on the table while its snapshot is
    taken (so no TRUNCATE or rewrite is half-way), records the table's file
    node, releases the lock (it was taken in a subtransaction), exports the
    snapshot and stays idle in its transaction; ``idle_in_transaction_session_timeout``
    = ``timeout_s`` ends it (and the vacuum horizon it holds back) if the run
    hangs. Each chunk takes the lock again for its own short transaction and
    checks the file node: a table rewritten since is read again under a new
    snapshot (:class:`~pgpoll.errors.TableRewrittenError`).
    """

    def __init__(self, dsn: str, t: SnapshotTable, timeout_s: float, *, lock_timeout_ms: int = 5000) -> None:
        self.dsn = dsn
        self.table = t
        self.timeout_s = timeout_s
        self.lock_timeout_ms = lock_timeout_ms
        self.exported = ""
        self.snapshot = Snapshot(0, 0)
        self.relfilenode = 0
        self._conn: Any = None

    def __enter__(self) -> SharedSnapshot:
        self._conn = connect(resolve_dsn(self.dsn), application_name=APPLICATION_NAME + "-export", autocommit=True)
        try:
            with self._conn.cursor() as cur:
                try:
                    _begin(cur, exported=None, lock_timeout_ms=self.lock_timeout_ms,
                           statement_timeout_ms=max(self.lock_timeout_ms * 2, 30_000))
                    cur.execute("SET LOCAL idle_in_transaction_session_timeout = %s",
                                (min(max(1, int(self.timeout_s * 1000)), 2**31 - 1),))
                    # The lock is held only while the snapshot is taken: a subtransaction's locks go with
                    # it, the transaction's snapshot stays. Holding ACCESS SHARE for the whole read would
                    # queue the application's ALTER TABLE or TRUNCATE behind it, and every query behind those.
                    cur.execute("SAVEPOINT pgpoll_lock")
                    _lock(self._conn, cur, self.table, self.lock_timeout_ms)
                    cur.execute("SELECT pg_current_snapshot()::text, (" + FILENODE_SQL + ")", (self.table.quoted_name,))
                    text, relfilenode = cur.fetchone()
                    cur.execute("ROLLBACK TO SAVEPOINT pgpoll_lock")
                    cur.execute("RELEASE SAVEPOINT pgpoll_lock")
                    cur.execute("SELECT pg_export_snapshot()")
                    self.exported = cur.fetchone()[0]
                except psycopg2.Error as exc:
                    raise translate(exc) from None
            self.snapshot = parse_snapshot(text)
            self.relfilenode = int(relfilenode)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """End the exporting transaction: once this returns, the snapshot can no longer be imported.

        Closing the connection alone does not promise that: the server ends the
        transaction when the exporter's backend reads the client's goodbye, which
        on a busy machine comes after a chunk's read has already imported the
        snapshot. ``ROLLBACK`` is answered only once the transaction has ended and
        its exported snapshot is gone (and the vacuum horizon it held is released).
        """
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(psycopg2.Error):  # the session may have ended already (its timeout)
            if not conn.closed and conn.info.transaction_status in _IN_TRANSACTION:
                with conn.cursor() as cur:
                    cur.execute("ROLLBACK")
        with contextlib.suppress(psycopg2.Error):
            conn.close()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


# ---- convergence -------------------------------------------------------------------------

_IN_PROGRESS_SQL = "SELECT x FROM unnest(%s::text[]) AS x WHERE pg_xact_status(x::xid8) = 'in progress'"


def wait_for_transactions(conn: Any, xids: Iterable[int], timeout_s: float, *, poll_s: float = 0.2) -> int:
    """Wait until none of ``xids`` (full ids) is in progress, then return ``pg_current_wal_lsn()``.

    Timeout: :class:`SourceError` (exit 4) naming the transactions still running.
    """
    pending = sorted({int(x) for x in xids})
    deadline = time.monotonic() + timeout_s
    wait = poll_s
    while pending:
        try:
            with pinned_transaction(conn) as cur:
                set_timeout(cur, PROBE_TIMEOUT_MS)
                cur.execute(_IN_PROGRESS_SQL, ([str(x) for x in pending],))
                pending = sorted(int(r[0]) for r in cur.fetchall())
        except psycopg2.Error as exc:
            raise translate(exc) from None
        if not pending:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            shown = ", ".join(str(x) for x in pending[:10]) + (", ..." if len(pending) > 10 else "")
            raise SourceError(
                f"transactions still in progress after {timeout_s:g} s: {shown}",
                "find them with: SELECT pid, xact_start, application_name FROM pg_stat_activity WHERE backend_xid "
                "IS NOT NULL; let them finish (or end them), or raise --wait-timeout, then run the snapshot again",
            )
        time.sleep(min(wait, left))
        wait = min(wait * 1.5, 1.0)
    return current_wal_lsn(conn)


__all__ = [
    "APPLICATION_NAME", "ChunkRead", "ChunkSpec", "SharedSnapshot", "SourceCheck", "check_source", "copy_sql",
    "current_wal_lsn", "lock_timeout_error", "parse_csv", "plan_chunks", "read_chunk", "stream_chunk",
    "wait_for_transactions",
]
