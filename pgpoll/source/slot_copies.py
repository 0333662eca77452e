"""Temporary copies of a slot: decode a later part of a backlog while the slot itself decodes the first.

Why: a peek builds its whole result before the first row leaves the server,
and a second peek of the same slot is refused while one runs, so one slot is
decoded by one backend at a time while the client waits. A temporary copy
(``pg_copy_logical_replication_slot(slot, copy, true)``) starts where the slot
is, is advanced to a split point L and peeked from there, at the same time as
the slot is peeked up to L (:mod:`pgpoll.ingest.decode_ranges`). Why that
splits a backlog exactly, from the PostgreSQL source:

* ``logicalfuncs.c``, ``pg_logical_slot_get_changes_guts``: the peek of the
  slot up to L decodes every record it reads and stops after the first one
  that ends at or past L::

      /* check limits */
      if (XLogRecPtrIsValid(upto_lsn) &&
          upto_lsn <= ctx->reader->EndRecPtr)
          break;

  so every commit record that *starts* before L is decoded (the records
  before it end before L), and at most one that starts at or after L (the
  record after an alignment gap that holds L).
* ``snapbuild.c``: the copy, its ``confirmed_flush`` advanced to L, skips a
  transaction whose commit record starts before L::

      /* Should the contents of transaction ending at 'ptr' be decoded? */
      bool SnapBuildXactNeedsSkip(SnapBuild *builder, XLogRecPtr ptr)
      { return ptr < builder->start_decoding_at; }

  (``decode.c`` passes ``buf->origptr``, the commit record's start; a
  non-transactional message is skipped the same way.)

So nothing is lost between the two, and the one transaction both may return
is the slot's last one: the reader drops it from the copy's side by its
COMMIT row's LSN (the record's end, unique), as it drops what the output
already holds.

A copy lives and dies on one connection, in one transaction: copy, advance,
the transaction-id reference, the peek, drop, roll back. Nothing survives
that transaction on a pooled server connection: the drop runs before the
transaction ends, an error drops the session's temporary slots itself
(``postgres.c``: "We also want to cleanup temporary slots on error.
ReplicationSlotCleanup()"), and a client that vanishes ends its server
session (PgBouncer closes a server connection left in a transaction), which
releases them too. A copy is never a failover slot and does not wait for
``synchronized_standby_slots``: the driver does not use copies of a failover
slot. Each copy takes one of ``max_replication_slots`` for its transaction:
:func:`free_slots` says how many are left.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Generator
from typing import Any

import psycopg2
import psycopg2.extensions
import pyarrow as pa

from pgpoll.lsn import Lsn
from pgpoll.source.arrow_peek import FetchUnavailableError, _peek_query, _ServerError, _with_int64_ids, set_batch_bytes
from pgpoll.source.connection import ConnectionTarget, connect_kwargs, redact
from pgpoll.source.names import sql_literal
from pgpoll.source.preflight import OK, WARN, CheckItem
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pin_settings_sql

__all__ = ["COPY_PREFIX", "CopyUnavailableError", "copies_in_use", "copy_check", "copy_name", "free_slots", "peek_copy",
           "usable_slots"]

COPY_PREFIX = "pgpoll_copy_"
"""Every temporary copy's name starts so (``pg_replication_slots`` shows them while a batch runs)."""

_FREE_SLOTS = ("SELECT current_setting('max_replication_slots')::int - count(*)::int FROM pg_replication_slots")


def usable_slots(free: int) -> int:
    """Of ``free`` replication slots, how many copies may take: all but one, so that a standby, a subscriber
    or an operator creating a slot while a batch is decoded still finds one."""
    return max(0, free - 1)


def free_slots(conn: Any) -> int:
    """How many more slots the server can hold now (``max_replication_slots`` less the slots that exist)."""
    with conn.cursor() as cur:
        cur.execute(_FREE_SLOTS)
        return int(cur.fetchone()[0])


def copy_check(conn: Any, slot: str | None, parallelism: int, *, asked: bool = True) -> CheckItem:
    """``pgpoll check``'s line on the copies ingest will make: how many per large batch, and why fewer.

    Each copy takes a ``max_replication_slots`` entry while its batch is
    decoded; ingest uses only free ones and reads with the slot alone when
    there are none, on a failover slot, or where the role may not copy.
    ``asked``: the parallelism was passed (an option or the environment),
    not the default; only then are fewer copies than it asks for a warning
    (the default's copy is a speed-up, and the slot decoding alone is the
    fallback ingest takes on its own).
    """
    wanted = max(0, parallelism - 1)
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('max_replication_slots')::int, count(*)::int, "
                    "has_function_privilege('pg_copy_logical_replication_slot(name, name, boolean)', 'EXECUTE') "
                    "AND (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) "
                    "FROM pg_replication_slots")
        limit, used, may_copy = cur.fetchone()
        failover = False
        if slot is not None and conn.server_version >= 170000:
            cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
            failover = bool(row and row[0])
    free = limit - used
    if wanted == 0:
        return CheckItem("decode copies", OK, "none (--decode-parallelism 1: the slot decodes alone)")
    if failover:
        return CheckItem("decode copies", OK, "none: a failover slot decodes alone (a copy does not wait for "
                         "synchronized_standby_slots)")
    if not may_copy:
        return CheckItem("decode copies", WARN, "none: this role may not copy slots (the slot decodes alone)",
                         "GRANT EXECUTE ON FUNCTION pg_copy_logical_replication_slot(name, name, boolean) and give the "
                         "role REPLICATION, or pass --decode-parallelism 1")
    uses = min(wanted, usable_slots(free))
    value = (f"{uses} per batch over 32 MiB of WAL ({free} of max_replication_slots = {limit} free; copies leave "
             "one for others)")
    if uses < wanted and not asked:
        return CheckItem("decode copies", OK, f"{value}: fewer than the default --decode-parallelism {parallelism} "
                         f"asks for; raise max_replication_slots by {wanted - uses} (a restart) for them")
    if uses < wanted:
        return CheckItem("decode copies", WARN, value, f"raise max_replication_slots by {wanted - uses} (a restart) "
                         f"for --decode-parallelism {parallelism}, or lower it")
    return CheckItem("decode copies", OK, value)


def copy_name(slot: str) -> str:
    """A fresh name for a temporary copy of ``slot`` (within the 63 bytes of a name)."""
    return f"{COPY_PREFIX}{uuid.uuid4().hex[:16]}_{slot}"[:63]


class CopyUnavailableError(FetchUnavailableError):
    """The copy could not be made or placed (no free slot, no permission, the slot moved): nothing was read.

    The reader then reads the range from the slot itself (:mod:`pgpoll.ingest.decode_ranges`).
    """


def peek_copy(
    target: ConnectionTarget,
    slot: str,
    plugin: str,
    *,
    start: Lsn,
    upto_lsn: Lsn | None,
    options: list[str],
    application_name: str,
    on_xid_reference: Callable[[int], None],
    on_cancel: Callable[[Callable[[], None]], None] | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """The changes of ``slot`` that commit from ``start`` (up to ``upto_lsn``), read through a temporary copy.

    Record batches as :func:`pgpoll.source.arrow_peek.peek_arrow` yields them.
    Raises :class:`CopyUnavailableError` for a failure before the first batch
    (the copy is gone with the transaction), a translated error after it.
    ``on_xid_reference`` gets a full transaction id read in the copy's
    transaction before its peek (:func:`pgpoll.source.slots.peek_rows`; the
    nearest full id is taken, so one read just before serves). ``on_cancel``
    gets a function another thread may call to cancel the copy's statement in
    flight (the server then raises, and drops the session's temporary slots).
    """
    import adbc_driver_postgresql.dbapi as adbc  # type: ignore[import-untyped]

    password = tuple(p for p in [target.password()] if p)
    dsn = psycopg2.extensions.make_dsn(target.dsn, **connect_kwargs(target, application_name))
    name = copy_name(slot)
    try:
        conn = adbc.connect(dsn, autocommit=False)
    except adbc.Error as exc:
        raise CopyUnavailableError(redact(str(exc), password)) from None
    first, made, streaming = True, False, False
    try:
        cur = conn.cursor()
        if on_cancel is not None:
            on_cancel(cur.adbc_cancel)
        set_batch_bytes(cur)
        cur.execute(pin_settings_sql())
        cur.fetchall()
        cur.execute(f"SELECT 1 FROM pg_copy_logical_replication_slot({sql_literal(slot)}, {sql_literal(name)}, true)")
        cur.fetchall()
        made = True
        cur.execute(f"SELECT end_lsn::text FROM pg_replication_slot_advance({sql_literal(name)}, "
                    f"{sql_literal(str(start))}::pg_lsn)")
        placed = Lsn.parse(cur.fetchall()[0][0])
        if placed != start:  # the advance is capped at the flush position: a split the driver took past it
            raise CopyUnavailableError(f"the copy of slot {slot!r} stopped at {placed}, not at {start}")
        cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
        on_xid_reference(int(cur.fetchall()[0][0]))
        cur.execute(_peek_query(plugin, name, upto_lsn, None, options))
        streaming = True
        for batch in cur.fetch_record_batch():
            converted = _with_int64_ids(batch)
            first = False
            yield converted
        streaming = False
        cur.execute(f"SELECT pg_drop_replication_slot({sql_literal(name)})")  # before the transaction ends
        cur.fetchall()
        made = False
    except CopyUnavailableError:
        raise
    except (adbc.Error, OSError, pa.ArrowException) as exc:
        if first:
            raise CopyUnavailableError(redact(str(exc), password)) from None
        raise translate(_ServerError(redact(str(exc), password)), slot=slot) from None
    finally:
        # Stopped in the middle of the peek's stream: the connection is closed as it is, inside its
        # transaction, so the server session ends (a pooler closes a server connection its client left
        # in a transaction) and the copy with it. Otherwise drop it before the transaction ends (after a
        # server error the server has dropped it already), so no pooled server connection keeps it.
        if made and not streaming:
            with contextlib.suppress(Exception):
                conn.cursor().execute(f"SELECT pg_drop_replication_slot({sql_literal(name)})")
        if not streaming:
            with contextlib.suppress(Exception):
                conn.rollback()
        with contextlib.suppress(Exception):
            conn.close()


def copies_in_use(conn: Any) -> list[str]:
    """Names of the temporary copies that exist now (a test's and an operator's check that none outlived a run)."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s ORDER BY 1",
                        (COPY_PREFIX.replace("_", r"\_") + "%",))
            return [row[0] for row in cur.fetchall()]
    except psycopg2.Error as exc:
        raise translate(exc) from None
