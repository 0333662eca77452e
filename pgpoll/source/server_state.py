"""The server side of ``pgpoll status``: the slots of a database, the WAL end and the server's clock.

Read-only: nothing here peeks, advances or locks a slot, so it is safe to run
while an ingest run holds the slot. Logical slots belong to one database;
:func:`read_server_state` reports the slots of the database the connection is
in (or the one slot asked for, wherever it is). The server's own clock is
read too, so that lag in time compares two timestamps from the same clock
(commit times are the server's). Everything is read in one read-only
transaction with the pinned settings.

On a hot standby (``pg_is_in_recovery()``) ``pg_current_wal_lsn()`` is an
error ("recovery is in progress", hint "WAL control functions cannot be
executed during recovery", ``xlogfuncs.c``); the WAL end there is ``pg_last_wal_replay_lsn()``, which is
also where a peek on the standby stops (``pg_logical_slot_get_changes_guts``
in ``logicalfuncs.c`` reads to ``GetXLogReplayRecPtr`` during recovery), and
:attr:`ServerState.in_recovery` says which one was read.

For ``status``'s lag without a peek (issue 15): :func:`captured_tables` names
the tables a pgoutput publication captures, and :func:`table_write_counts`
reads their cumulative inserts, updates and deletes from the statistics
views. A run records these counts in the commit log; unchanged counts later
mean nothing was written to a captured table since (nothing pending). The
statistics are cumulative but not instant: a backend reports its counts when
its transaction ends and it goes idle (PostgreSQL 15+ at most once a second,
or on ``pg_stat_force_next_flush()``), and a crash or ``pg_stat_reset()``
sets them back, so a caller compares them for equality only, never for order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg2

from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.slot_copies import COPY_PREFIX

# Counts per captured table. A partitioned table's rows live in its leaf partitions, which is
# where the statistics count them: the counts of the whole partition tree are summed (the table itself
# besides pg_partition_tree, which lists nothing for a plain table). A table that does not exist is left out.
_COUNTS_OF_TABLES_SQL = """
SELECT t.schema_name, t.table_name,
       coalesce(sum(s.n_tup_ins), 0)::bigint, coalesce(sum(s.n_tup_upd), 0)::bigint,
       coalesce(sum(s.n_tup_del), 0)::bigint
FROM unnest(%s::text[], %s::text[]) AS t(schema_name, table_name)
JOIN pg_catalog.pg_namespace n ON n.nspname = t.schema_name
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name
CROSS JOIN LATERAL (SELECT c.oid AS relid UNION SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)) AS p
LEFT JOIN pg_catalog.pg_stat_all_tables s ON s.relid = p.relid
GROUP BY t.schema_name, t.table_name
"""

_COUNTS_OF_ALL_SQL = """
SELECT schemaname, relname, n_tup_ins, n_tup_upd, n_tup_del
FROM pg_catalog.pg_stat_user_tables
"""

_PUBLISHED_TABLES_SQL = """
SELECT DISTINCT schemaname::text, tablename::text
FROM pg_catalog.pg_publication_tables
WHERE pubname = ANY(%s::text[])
ORDER BY 1, 2
"""


@dataclass(frozen=True)
class ServerState:
    """What the server says at one moment: its database, WAL end, clock and slots."""

    database: str
    current_lsn: Lsn
    server_time: datetime
    slots: tuple[slot_access.SlotInfo, ...]
    in_recovery: bool = False
    """A hot standby: ``current_lsn`` is its replay position, and its statistics miss the primary's writes."""


_CLOCK_SQL = """
SELECT current_database(), pg_is_in_recovery(),
       (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text,
       clock_timestamp()
"""


def _server_clock(cur: Any) -> tuple[str, bool, Lsn, datetime]:
    cur.execute(_CLOCK_SQL)
    database, recovery, lsn_text, now = cur.fetchone()
    return str(database), bool(recovery), Lsn.parse(lsn_text), now


def in_recovery(conn: Any) -> bool:
    """True on a hot standby (``pg_is_in_recovery()``): nothing can be written there, not even a logical message."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            return bool(cur.fetchone()[0])
    except psycopg2.Error as exc:
        raise translate(exc) from None


def read_server_state(conn: Any, slot: str | None = None) -> ServerState:
    """The logical slots of the connected database (or only ``slot``), with the WAL end and clock.

    Ingest's temporary copies of a slot (:mod:`pgpoll.source.slot_copies`) are left out: each lives for one
    batch under a new name, so ``status`` and its Prometheus series would otherwise gain a slot per batch.

    A named slot that does not exist raises :class:`pgpoll.errors.SlotNotFoundError`.
    """
    try:
        with pinned_transaction(conn) as cur:
            database, recovery, current_lsn, now = _server_clock(cur)
            if slot is not None:
                infos = [slot_access.get_slot(conn, slot)]
            else:
                infos = [i for i in slot_access.list_slots(conn) if i.slot_type == "logical" and i.database == database
                         and not i.name.startswith(COPY_PREFIX)]  # ingest's temporary copies live for one batch
    except psycopg2.Error as exc:
        raise translate(exc, slot=slot) from None
    return ServerState(database=database, current_lsn=current_lsn, server_time=now, slots=tuple(infos),
                       in_recovery=recovery)


def table_key(schema: str, table: str) -> str:
    """The plain-text key of a table in :func:`table_write_counts`' answer: ``schema.table``, unquoted."""
    return f"{schema}.{table}"


def table_write_counts(conn: Any, tables: list[tuple[str, str]] | None) -> dict[str, list[int]]:
    """Cumulative ``[inserts, updates, deletes]`` of each ``(schema, table)``, keyed ``"schema.table"``.

    ``None`` reads every user table (test_decoding captures them all). The
    counts come from ``pg_stat_user_tables`` (``n_tup_ins``, ``n_tup_upd``,
    ``n_tup_del``), summed over a partitioned table's partitions; a table
    that does not exist is absent from the answer. The keys are plain text
    (``table_key``), not quoted identifiers: ``"My Schema".t`` is
    ``My Schema.t``. Read in one read-only transaction with the pinned
    settings; nothing is locked, so it is safe beside a running ingest.
    """
    try:
        with pinned_transaction(conn) as cur:
            if tables is None:
                cur.execute(_COUNTS_OF_ALL_SQL)
            else:
                if not tables:
                    return {}
                cur.execute(_COUNTS_OF_TABLES_SQL, ([s for s, _t in tables], [t for _s, t in tables]))
            rows = cur.fetchall()
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return {table_key(str(schema), str(table)): [int(ins), int(upd), int(dele)] for schema, table, ins, upd, dele in rows}


def captured_tables(conn: Any, publications: list[str]) -> list[tuple[str, str]]:
    """The ``(schema, table)`` pairs the named pgoutput publications capture, sorted, each once.

    From ``pg_publication_tables`` (which lists a partitioned table's leaf
    partitions unless the publication publishes via the root). A publication
    that does not exist contributes nothing.
    """
    if not publications:
        return []
    try:
        with pinned_transaction(conn) as cur:
            cur.execute(_PUBLISHED_TABLES_SQL, (list(publications),))
            rows = cur.fetchall()
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return [(str(schema), str(table)) for schema, table in rows]
