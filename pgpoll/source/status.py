"""The server side of ``pgpoll status``: the slots of a database, the WAL end and the server's clock.

Read-only: nothing here peeks, advances or locks a slot, so it is safe to run
while an ingest run holds the slot. Logical slots belong to one database;
:func:`read_server_state` reports the slots of the database the connection is
in (or the one slot asked for, wherever it is). The server's own clock is
read too, so that lag in time compares two timestamps from the same clock
(commit times are the server's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

import psycopg2

from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.server_errors import translate


@dataclass(frozen=True)
class ServerState:
    """What the server says at one moment: its database, WAL end, clock and slots."""

    database: str
    current_lsn: Lsn
    server_time: datetime
    slots: tuple[slot_access.SlotInfo, ...]


def _server_clock(conn: Any) -> tuple[str, Lsn, datetime]:
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database(), pg_current_wal_lsn()::text, clock_timestamp()")
            database, lsn_text, now = cur.fetchone()
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return str(database), Lsn.parse(lsn_text), now


def read_server_state(conn: Any, slot: Optional[str] = None) -> ServerState:
    """The logical slots of the connected database (or only ``slot``), with the WAL end and clock.

    A named slot that does not exist raises :class:`pgpoll.errors.SlotNotFoundError`.
    """
    database, current_lsn, now = _server_clock(conn)
    if slot is not None:
        infos = [slot_access.get_slot(conn, slot)]
    else:
        infos = [i for i in slot_access.list_slots(conn) if i.slot_type == "logical" and i.database == database]
    return ServerState(database=database, current_lsn=current_lsn, server_time=now, slots=tuple(infos))
