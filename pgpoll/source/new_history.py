"""What ``resync`` needs of a server whose history is not the output's: WAL past the mark, and what a slot skips.

After an unsafe failover (an asynchronous standby promoted before it had
received WAL the output read) the new primary's timeline left the output's
at a switch point S below the output's high-water mark H, and a slot
created there sits below H. ``ingest`` goes on from H (it drops every
transaction whose COMMIT row is at or below the mark) and advances the slot
to H, so every transaction the new primary committed below H is skipped.
That is exact only if each of them is inside the snapshot ``resync`` takes.
This module supplies the server side of that argument
(:mod:`pgpoll.snapshot.resync_history` makes it):

* :func:`move_wal_past`: the slot can only be advanced to a position the
  server has flushed (``pg_replication_slot_advance`` clamps a target past
  ``GetFlushRecPtr()`` silently, ``slotfuncs.c``), and a peek ``upto_lsn``
  past the flush point would miss commits written later below H. A quiet new
  primary may be far below H: ``pg_switch_wal()`` ends the current segment
  (the switch record is flushed with the segment's padding, so the flush
  position reaches the next segment's start), but does nothing when no WAL
  was written since the last switch, so each switch follows a
  non-transactional logical message. Bounded: at most :data:`MAX_DISTANCE`
  bytes of WAL (one segment per switch). The messages lie below H, and a
  slot at H skips them (``logicalmsg_decode`` drops a non-transactional
  message before ``start_decoding_at``), so no change reaches the output.
  ``pg_switch_wal()`` is superuser-only unless granted: without it, or beyond
  the bound, :class:`~pgpoll.errors.SlotGapError` (exit 4) names the fixes.
* :func:`committed_below`: the transactions a slot skips once advanced to H
  are those whose commit record *starts* below H (``SnapBuildXactNeedsSkip``
  compares the record's start with ``start_decoding_at``). A peek with
  ``upto_lsn`` H decodes every record that starts below H (the loop in
  ``pg_logical_slot_get_changes_guts`` stops after the first record whose
  end reaches ``upto_lsn``), so it returns exactly those, and more only when
  a commit record straddles H. The server keeps the distinct ids
  (``SELECT DISTINCT xid``): the rows never travel. Widened to full ids with
  the reference read after the peek, nearest it (:func:`_nearest`).
* :func:`wait_visible`: a commit record in the WAL is not yet a visible
  transaction (one waiting for a synchronous standby is still in the
  ProcArray: ``RecordTransactionCommit``, ``xact.c``). Waiting until each id is
  visible to ``pg_current_snapshot()`` means it has left the ProcArray, so
  every snapshot taken afterwards sees it (``latestCompletedXid`` only grows).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg2

from pgpoll.errors import SlotGapError, SourceError
from pgpoll.lsn import Lsn
from pgpoll.source.names import check_slot_name
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.slots import BINARY_PLUGINS
from pgpoll.source.waits import CallWatch, watched

MAX_DISTANCE = 1 << 30
"""Bytes of WAL :func:`move_wal_past` may write to reach the output's mark (1 GiB: 64 switches of 16 MB segments)."""

SWITCH_FIX = (
    "wait until the server has written past {target} (SELECT pg_current_wal_flush_lsn()) and rerun, or {grant}, "
    "or snapshot into a new output (see docs/how-to/lost-slot.md#a-lost-slot-another-server-a-diverged-timeline); "
    "nothing was written and the slot was not moved"
)
SWITCH_GRANT = "GRANT EXECUTE ON FUNCTION pg_switch_wal() TO <the role> (or run as a superuser)"


def flush_lsn(conn: Any) -> Lsn:
    """``pg_current_wal_flush_lsn()``: the end of WAL a peek reads to and an advance is clamped at."""
    with pinned_transaction(conn) as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()::text")
        return Lsn.parse(cur.fetchone()[0])


def move_wal_past(conn: Any, target: Lsn, *, max_distance: int = MAX_DISTANCE) -> int:
    """Make the server's flushed WAL reach ``target`` (module docstring); returns how many switches it took.

    Nothing is done when it is there already. Raises :class:`SlotGapError`
    (exit 4) when ``target`` is more than ``max_distance`` bytes ahead or the
    role may not call ``pg_switch_wal()``.
    """
    try:
        now = flush_lsn(conn)
        if now >= target:
            return 0
        distance = int(target) - int(now)
        if distance > max_distance:
            raise SlotGapError(
                f"the server's WAL ends at {now}, {distance:,} bytes below the output's high-water mark {target}: more "
                f"than resync writes to reach it ({max_distance:,} bytes)",
                SWITCH_FIX.format(target=target, grant="let the applications write"))
        with pinned_transaction(conn) as cur:
            cur.execute("SELECT has_function_privilege('pg_catalog.pg_switch_wal()', 'EXECUTE'),"
                        " pg_size_bytes(current_setting('wal_segment_size'))")
            allowed, segment = cur.fetchone()
        if not allowed:
            raise SlotGapError(
                f"the server's WAL ends at {now}, below the output's high-water mark {target}, and this role may not "
                "call pg_switch_wal() to move it there", SWITCH_FIX.format(target=target, grant=SWITCH_GRANT))
        switches = 0
        while now < target and switches <= distance // int(segment) + 2:
            with pinned_transaction(conn, readonly=False) as cur:
                cur.execute("SELECT pg_logical_emit_message(false, 'pgpoll-resync', '')")  # WAL for the switch to end
                cur.execute("SELECT pg_switch_wal()")
            switches += 1
            now = flush_lsn(conn)
    except psycopg2.Error as exc:
        raise translate(exc) from None
    if now < target:
        raise SourceError(f"the server's flushed WAL is still at {now} after {switches} WAL switches, below {target}",
                          "check the server log; rerun pgpoll resync")
    return switches


def committed_below(conn: Any, slot: str, plugin: str, options: list[str], upto: Lsn,
                    watch: CallWatch | None = None) -> list[int]:
    """The full ids of the transactions the slot returns up to ``upto`` (module docstring); the slot does not move.

    Only the transactions the slot's plugin would write are there (pgoutput
    leaves out those that touch no published table: they do not matter to
    the output either). Non-transactional messages (id 0) are left out.
    """
    check_slot_name(slot)
    func = "pg_logical_slot_peek_binary_changes" if plugin in BINARY_PLUGINS else "pg_logical_slot_peek_changes"
    placeholders = "".join(", %s" for _ in options)
    query = (f"SELECT DISTINCT xid::text::bigint FROM {func}(%s, %s::pg_lsn, NULL{placeholders})"
             " WHERE xid IS NOT NULL AND xid::text <> '0'")
    try:
        with pinned_transaction(conn) as cur:
            with watched(watch, cur):  # a failover slot's peek can wait on synchronized_standby_slots
                cur.execute(query, [slot, str(upto), *options])
            ids = [int(r[0]) for r in cur.fetchall()]
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
            reference = int(cur.fetchone()[0])
    except psycopg2.Error as exc:
        raise translate(exc, slot=slot) from None
    return sorted(_nearest(x, reference) for x in ids)


def _nearest(xid: int, reference: int) -> int:
    """The full id of 32-bit ``xid`` nearest ``reference``: a commit still waiting (a synchronous standby) can be at or
    above the snapshot's ``xmax``, which :func:`~pgpoll.xids.widen_xid` takes for the previous epoch."""
    epoch = 1 << 32
    full = (reference & ~(epoch - 1)) | xid
    if full - reference >= epoch // 2:
        full -= epoch
    elif reference - full > epoch // 2:
        full += epoch
    if full < 0:
        raise SourceError(f"transaction id {xid} is not near the server's {reference}", "rerun pgpoll resync")
    return full


_NOT_VISIBLE = ("SELECT x FROM unnest(%s::text[]) AS x"
                " WHERE NOT pg_visible_in_snapshot(x::xid8, pg_current_snapshot())")


def wait_visible(conn: Any, xids: Iterable[int], timeout_s: float, *, poll_s: float = 0.2) -> None:
    """Wait until every one of ``xids`` (full ids of committed transactions) is visible to a new snapshot.

    Timeout: :class:`SourceError` (exit 4) naming the ones still invisible.
    """
    pending = sorted({int(x) for x in xids})
    deadline = time.monotonic() + timeout_s
    while pending:
        try:
            with pinned_transaction(conn) as cur:
                cur.execute(_NOT_VISIBLE, ([str(x) for x in pending],))
                pending = sorted(int(r[0]) for r in cur.fetchall())
        except psycopg2.Error as exc:
            raise translate(exc) from None
        if not pending:
            return
        if time.monotonic() >= deadline:
            shown = ", ".join(str(x) for x in pending[:10]) + (", ..." if len(pending) > 10 else "")
            raise SourceError(
                f"transactions committed below the output's high-water mark are still not visible after "
                f"{timeout_s:g} s: {shown}",
                "find what holds them (a synchronous standby's wait: SELECT pid, wait_event FROM pg_stat_activity), "
                "release it, and rerun pgpoll resync; nothing was written and the slot was not moved")
        time.sleep(poll_s)
