"""Where the next batch of a slot may end: its commit boundaries, found by the server without shipping rows.

A streaming batch ends at a *commit boundary*: the ``lsn`` of a COMMIT row
(the end of the commit record) or of a non-transactional logical message.
The slot may only ever be advanced to such a position (a commit record
straddling any other would make PostgreSQL skip its transaction forever:
see ``/work/shared/POSTGRES-NOTES.md``, "Advancing"), and a batch
``(start, end]`` holds exactly the transactions whose commit LSN lies in it.

Finding the boundaries costs a decode: the only thing that knows where
transactions end is the output plugin. Making one does not:
:func:`mark_boundary` writes a non-transactional message, whose LSN is a
boundary by construction (a stream's ``Trigger.AvailableNow`` run without
limits ends there). :func:`next_boundary` runs the peek on
the server and aggregates it there (``WITH ORDINALITY`` and a running sum in
a window), so one row comes back however large the backlog: the number of
rows the peek returned, the first boundary after ``after``, and the last
boundary whose running totals of changes and of their plugin-output bytes stay
within the limits (without limits, a plain aggregate: the last boundary, with
no window and no sort, costs about what the server's decode costs). The peek never moves the slot, and it never reads past the
flush position as it was when the call started (``GetFlushRecPtr()`` in
``pg_logical_slot_get_changes_guts``), so every boundary it returns is flushed.

With a limit, the peek is bounded by ``upto_nchanges`` and widened (four
times, each time) only while it stopped on that bound before reaching the
limit: a batch of ``max_changes`` changes decodes about as much as the batch
holds, not the whole backlog. ``upto_nchanges`` counts every output row
(BEGIN, COMMIT, pgoutput's Relation rows) and stops on a transaction
boundary, so a peek bounded by it can return one whole transaction more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg2

from pgpoll.errors import SourceError
from pgpoll.lsn import Lsn
from pgpoll.source.control import write_heartbeat
from pgpoll.source.names import check_slot_name
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.slots import BINARY_PLUGINS
from pgpoll.source.waits import CallWatch, watched

__all__ = ["Boundary", "flush_position", "mark_boundary", "next_boundary", "wait_flushed"]

# What is a boundary and what is a change, per plugin, as SQL over the peek's ``data``.
# pgoutput (protocol 1, no streaming): the first byte is the message type; a Message ('M') has its flags
# (1 = transactional) in the second byte. test_decoding: the line's first words.
_PGOUTPUT = (
    "(get_byte(data, 0) = 67 OR (get_byte(data, 0) = 77 AND get_byte(data, 1) = 0))",  # 'C', or 'M' non-transactional
    "(get_byte(data, 0) IN (73, 85, 68, 84) OR (get_byte(data, 0) = 77))",  # 'I' 'U' 'D' 'T', 'M'
)
_TEST_DECODING = (
    "(data LIKE 'COMMIT%%' OR data LIKE 'message: transactional: 0 %%')",  # %% : psycopg2 parameter syntax
    "(data LIKE 'table %%' OR data LIKE 'message: %%')",
)
_FIRST_PEEK_ROWS = 10_000  # a bytes-only limit's first peek (rows of unknown size)
_WIDEN = 4


@dataclass(frozen=True)
class Boundary:
    """The end a batch may take, and what the batch up to it holds.

    ``end`` is ``None`` when no boundary lies after ``after`` (nothing new).
    ``changes`` and ``bytes`` are the changes up to ``end`` (rows of the
    change log before any table filter) and their plugin output's size;
    ``over_limit`` is True when ``end`` is the first boundary and already
    past a limit (one transaction larger than the limit: it passes whole);
    ``peeked_rows`` is what the server decoded to find it (all peeks).
    """

    end: Lsn | None
    changes: int = 0
    bytes: int = 0
    over_limit: bool = False
    peeked_rows: int = 0


def _query(plugin: str, options: list[str]) -> str:
    func = "pg_logical_slot_peek_binary_changes" if plugin in BINARY_PLUGINS else "pg_logical_slot_peek_changes"
    is_boundary, is_change = _PGOUTPUT if plugin in BINARY_PLUGINS else _TEST_DECODING
    size = "octet_length(data)"
    args = "%(slot)s, %(upto_lsn)s::pg_lsn, %(upto_n)s::int"
    opts = "".join(f", %(o{i})s" for i in range(len(options)))
    # Boundaries are compared as numbers (lsn - '0/0'); the window sums run in peek order (ordinality).
    return f"""
WITH p AS (
  SELECT (lsn - '0/0'::pg_lsn)::bigint AS lsn, n, {is_boundary} AS b,
         sum(CASE WHEN {is_change} THEN 1 ELSE 0 END) OVER w AS changes,
         sum(CASE WHEN {is_change} THEN {size} ELSE 0 END) OVER w AS bytes
    FROM {func}({args}{opts}) WITH ORDINALITY AS t(lsn, xid, data, n)
  WINDOW w AS (ORDER BY n ROWS UNBOUNDED PRECEDING)
), q AS (
  SELECT lsn, changes, bytes, changes - coalesce(
           (SELECT max(changes) FROM p p0 WHERE p0.b AND p0.lsn <= %(after)s), 0) AS own_changes,
         bytes - coalesce((SELECT max(bytes) FROM p p0 WHERE p0.b AND p0.lsn <= %(after)s), 0) AS own_bytes
    FROM p WHERE b AND lsn > %(after)s AND (%(cap)s::bigint IS NULL OR lsn <= %(cap)s::bigint)
)
SELECT (SELECT count(*) FROM p),
       (SELECT lsn FROM q ORDER BY lsn LIMIT 1),
       (SELECT own_changes FROM q ORDER BY lsn LIMIT 1),
       (SELECT own_bytes FROM q ORDER BY lsn LIMIT 1),
       (SELECT lsn FROM q WHERE (%(max_changes)s::bigint IS NULL OR own_changes <= %(max_changes)s::bigint)
                            AND (%(max_bytes)s::bigint IS NULL OR own_bytes <= %(max_bytes)s::bigint)
         ORDER BY lsn DESC LIMIT 1),
       (SELECT own_changes FROM q WHERE (%(max_changes)s::bigint IS NULL OR own_changes <= %(max_changes)s::bigint)
                            AND (%(max_bytes)s::bigint IS NULL OR own_bytes <= %(max_bytes)s::bigint)
         ORDER BY lsn DESC LIMIT 1),
       (SELECT own_bytes FROM q WHERE (%(max_changes)s::bigint IS NULL OR own_changes <= %(max_changes)s::bigint)
                            AND (%(max_bytes)s::bigint IS NULL OR own_bytes <= %(max_bytes)s::bigint)
         ORDER BY lsn DESC LIMIT 1),
       (SELECT count(*) FROM q WHERE (%(max_changes)s::bigint IS NOT NULL AND own_changes > %(max_changes)s::bigint)
                                  OR (%(max_bytes)s::bigint IS NOT NULL AND own_bytes > %(max_bytes)s::bigint))
"""


def _query_all(plugin: str, options: list[str]) -> str:
    """Without limits: the last boundary in range, as one plain aggregate (no window, no sort: about a plain decode)."""
    func = "pg_logical_slot_peek_binary_changes" if plugin in BINARY_PLUGINS else "pg_logical_slot_peek_changes"
    is_boundary, is_change = _PGOUTPUT if plugin in BINARY_PLUGINS else _TEST_DECODING
    opts = "".join(f", %(o{i})s" for i in range(len(options)))
    return f"""
SELECT count(*),
       (max(lsn) FILTER (WHERE {is_boundary} AND lsn > %(after)s::pg_lsn
                           AND (%(upto_lsn)s::pg_lsn IS NULL OR lsn <= %(upto_lsn)s::pg_lsn)) - '0/0'::pg_lsn)::bigint,
       count(*) FILTER (WHERE {is_change}),
       coalesce(sum(octet_length(data)) FILTER (WHERE {is_change}), 0)
  FROM {func}(%(slot)s, %(upto_lsn)s::pg_lsn, NULL::int{opts})
"""


def _first_bound(max_changes: int | None, max_bytes: int | None) -> int | None:
    """The first peek's ``upto_nchanges``: about twice the changes the limit allows (BEGIN/COMMIT rows count too)."""
    if max_changes is not None:
        return 2 * max_changes + 16
    if max_bytes is not None:
        return _FIRST_PEEK_ROWS
    return None


def next_boundary(
    conn: Any,
    slot: str,
    plugin: str,
    options: list[str],
    *,
    after: Lsn,
    cap: Lsn | None = None,
    max_changes: int | None = None,
    max_bytes: int | None = None,
    watch: CallWatch | None = None,
) -> Boundary:
    """The last boundary after ``after`` (and at most ``cap``) within the limits, or the first one past them.

    ``after`` is a boundary the slot is at (or behind); ``cap`` bounds the
    peek (``upto_lsn``) and the boundaries (a Trigger.AvailableNow run's
    target: nothing committed later is taken). Each peek runs in one
    read-only transaction with the pinned settings; the slot does not move.
    ``watch`` reports a peek that waits on the server and cancels a failover
    slot's hopeless wait on ``synchronized_standby_slots`` (:mod:`pgpoll.source.waits`):
    the SQL peek of a failover slot waits for those standbys as ingest's does.
    """
    check_slot_name(slot)
    if max_changes is None and max_bytes is None:
        return _last_boundary(conn, slot, plugin, options, after, cap, watch)
    query = _query(plugin, options)
    upto_n = _first_bound(max_changes, max_bytes)
    peeked = 0
    while True:
        params: dict[str, Any] = {
            "slot": slot, "upto_lsn": str(cap) if cap is not None else None, "upto_n": upto_n, "after": int(after),
            "cap": int(cap) if cap is not None else None, "max_changes": max_changes, "max_bytes": max_bytes,
            **{f"o{i}": value for i, value in enumerate(options)},
        }
        try:
            with pinned_transaction(conn) as cur:
                with watched(watch, cur):
                    cur.execute(query, params)
                row = cur.fetchone()
        except psycopg2.Error as exc:
            raise translate(exc, slot=slot) from None
        rows, first, first_changes, first_bytes, within, within_changes, within_bytes, over = row
        peeked += int(rows)
        stopped_on_bound = upto_n is not None and rows >= upto_n
        if first is None:
            if stopped_on_bound and upto_n is not None:  # only rows at or before `after` so far: look further
                upto_n *= _WIDEN
                continue
            return Boundary(None, peeked_rows=peeked)
        if within is None:  # the first transaction alone is past a limit: it passes whole
            return Boundary(Lsn(first), int(first_changes), int(first_bytes), True, peeked)
        if over or not stopped_on_bound or upto_n is None:
            return Boundary(Lsn(within), int(within_changes), int(within_bytes), False, peeked)
        upto_n *= _WIDEN  # the peek stopped on its bound before reaching a limit: more may fit


def _last_boundary(conn: Any, slot: str, plugin: str, options: list[str], after: Lsn, cap: Lsn | None,
                   watch: CallWatch | None = None) -> Boundary:
    """:func:`next_boundary` without limits. ``changes``/``bytes`` count every change of the peek (the slot is
    at ``after`` when a stream asks, so that is what the batch holds before ``tables`` filters it)."""
    params: dict[str, Any] = {"slot": slot, "after": str(after), "upto_lsn": str(cap) if cap is not None else None,
                              **{f"o{i}": value for i, value in enumerate(options)}}
    try:
        with pinned_transaction(conn) as cur:
            with watched(watch, cur):
                cur.execute(_query_all(plugin, options), params)
            rows, last, changes, size = cur.fetchone()
    except psycopg2.Error as exc:
        raise translate(exc, slot=slot) from None
    return Boundary(Lsn(last) if last is not None else None, int(changes), int(size), False, int(rows))


_READ_UP_TO = """
SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)::text
"""


def flush_position(conn: Any) -> Lsn:
    """``pg_current_wal_flush_lsn()``: what a peek started now may read up to (a Trigger.AvailableNow target).

    A WAL position, not a boundary: it only caps boundaries, the slot is
    never advanced to it. On a hot standby, where the flush position is an
    error ("recovery is in progress"), it is ``pg_last_wal_replay_lsn()``:
    a peek there reads up to what was replayed (``GetXLogReplayRecPtr`` in
    ``pg_logical_slot_get_changes_guts``, ``logicalfuncs.c``, during recovery).
    """
    try:
        with pinned_transaction(conn) as cur:
            cur.execute(_READ_UP_TO)
            return Lsn.parse(cur.fetchone()[0])
    except psycopg2.Error as exc:
        raise translate(exc) from None


def mark_boundary(conn: Any, content: str) -> Lsn:
    """Write a non-transactional ``pgpoll.heartbeat`` message; its LSN is a boundary made without a decode.

    Why it is one (PostgreSQL 15, read in the source): ``LogLogicalMessage``
    (``replication/logical/message.c``) returns what ``XLogInsert`` returns,
    the *end* of the message's WAL record; ``logicalmsg_decode``
    (``decode.c``) queues the message with ``buf->endptr``, the same record
    end, and ``message_cb_wrapper`` (``logical.c``) makes that the row's
    ``lsn``. So the returned LSN is the message row's ``lsn`` in a peek, and a
    record end: every later record, a commit record too, starts at or after
    it, so advancing the slot there skips no transaction. The message is the
    batch's last row; the decoders drop it as they drop every heartbeat (the
    assembler takes its ``lsn`` as the batch's last boundary), so it is never
    a change. Both plugins return it: test_decoding always, pgoutput with
    ``messages`` on, which pgpoll's peek options always set.

    On PostgreSQL below 17 the message is not flushed by itself; the
    transaction that wrote it commits without an xid and only asks the WAL
    writer to flush it (``RecordTransactionCommit``, ``XLogSetAsyncXactLSN``):
    a peek sees it once :func:`wait_flushed` says so. From 17 the call flushes
    it (``flush => true``).
    """
    return write_heartbeat(conn, content, transactional=False)


def wait_flushed(conn: Any, lsn: Lsn, timeout_s: float = 30.0) -> Lsn:
    """Wait until ``pg_current_wal_flush_lsn()`` reaches ``lsn`` (a peek never reads past the flush position).

    The WAL writer flushes within ``wal_writer_delay`` (200 ms by default);
    :class:`SourceError` when it has not after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        flushed = flush_position(conn)
        if flushed >= lsn:
            return flushed
        if time.monotonic() >= deadline:
            raise SourceError(
                f"the WAL up to {lsn} was not flushed within {timeout_s:.0f} s (flushed up to {flushed})",
                "check the server's WAL writer and disk (pg_stat_wal, the server log); then run the query again",
                lsn=str(lsn),
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
