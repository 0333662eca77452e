"""Which server, and which timeline, the slot is read from: the facts the gap check compares with the output.

Every commit-log record carries the server's system identifier and
timeline (``server`` in the record, see ``docs/reference/json-records.md``),
so a later run can tell whether a slot behind the output's high-water mark
is the same history (harmless: a slot returned to its last checkpointed
position after a crash) or a new primary's, whose LSNs up to the mark may
be other transactions (:mod:`pgpoll.source.slot_gap`).

* The system identifier comes from ``pg_control_system()`` (executable by
  every role: PostgreSQL grants it to PUBLIC). A physical standby has its
  primary's; a cluster restored from a logical dump, or a new ``initdb``,
  has another.
* The timeline is the one WAL is *inserted* on: the first 8 hex digits of
  ``pg_walfile_name(pg_current_wal_lsn())`` (``XLogFileName`` with
  ``GetWALInsertionTimeLine()`` in ``xlogfuncs.c``). Not
  ``pg_control_checkpoint().timeline_id``: that is the last checkpoint's, and
  a promotion only *requests* the end-of-recovery checkpoint — seen here on
  15.18: two seconds after ``pg_promote()`` it still said 1 while WAL was
  written on timeline 2. During recovery (a hot standby) ``pg_walfile_name``
  is refused, so there the last restartpoint's timeline is used: it can only
  be older, which makes the check refuse, never accept, wrongly.
* The history of a timeline (``pg_wal/0000000N.history``: one line per
  ancestor, ``parent-tli <TAB> switch-point <TAB> reason``) is read with
  ``pg_read_binary_file``, whose EXECUTE PostgreSQL revokes from PUBLIC: it
  needs a superuser, or ``GRANT EXECUTE ON FUNCTION pg_read_binary_file(text)
  TO <role>`` (then files inside the data directory are readable; seen here:
  membership in ``pg_read_server_files`` alone is still refused, it lifts
  only the path restriction). Without it :func:`read_timeline_history`
  raises :class:`PrivilegeError` naming that grant: the check refuses rather
  than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgpoll.errors import PrivilegeError, SourceError
from pgpoll.lsn import Lsn

_IDENTITY_SQL = (
    "SELECT s.system_identifier::text, pg_is_in_recovery(), c.timeline_id"
    " FROM pg_control_system() s, pg_control_checkpoint() c"
)


@dataclass(frozen=True)
class ServerIdentity:
    """A server's system identifier (text: it is an unsigned 64-bit number) and current timeline."""

    system_identifier: str
    timeline: int

    def as_json(self) -> dict[str, Any]:
        """The commit record's ``server`` field."""
        return {"system_identifier": self.system_identifier, "timeline": self.timeline}

    @classmethod
    def from_json(cls, data: Any) -> ServerIdentity | None:
        """The identity a record's ``server`` field holds; None when it has none (records of older versions)."""
        if not isinstance(data, dict):
            return None
        sysid, tli = data.get("system_identifier"), data.get("timeline")
        if not isinstance(sysid, str) or not isinstance(tli, int) or isinstance(tli, bool):
            return None
        return cls(sysid, tli)


@dataclass(frozen=True)
class TimelineSwitch:
    """One line of a timeline history file: timeline ``timeline`` ended at ``switch_point``."""

    timeline: int
    switch_point: Lsn


def read_identity(conn: Any) -> ServerIdentity:
    """The server's system identifier and current timeline (see the module docstring for why this timeline)."""
    with conn.cursor() as cur:
        cur.execute(_IDENTITY_SQL)
        sysid, in_recovery, checkpoint_tli = cur.fetchone()
        timeline = int(checkpoint_tli)
        if not in_recovery:
            cur.execute("SELECT pg_walfile_name(pg_current_wal_lsn())")
            timeline = int(cur.fetchone()[0][:8], 16)
    conn.commit()
    return ServerIdentity(str(sysid), timeline)


def parse_history(text: str) -> list[TimelineSwitch]:
    """The switches a history file lists (``timeline.c``'s format: comments and blank lines skipped)."""
    found = []
    for line in text.splitlines():
        fields = line.strip().split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or not fields[0].isdigit():
            raise SourceError(f"timeline history line {line!r} is not 'timeline<TAB>switch-point'",
                              "check the server's pg_wal/*.history files")
        found.append(TimelineSwitch(int(fields[0]), Lsn.parse(fields[1])))
    return found


HISTORY_GRANT = "GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO <the role> (or run as a superuser)"


def can_read_timeline_history(conn: Any) -> bool:
    """Whether this role may call ``pg_read_binary_file(text)`` (true for a superuser): what a check after a failover
    needs (:func:`read_timeline_history`), reported by ``pgpoll check`` before a failover makes it matter."""
    with conn.cursor() as cur:
        cur.execute("SELECT has_function_privilege('pg_catalog.pg_read_binary_file(text)', 'EXECUTE')")
        allowed = bool(cur.fetchone()[0])
    conn.commit()
    return allowed


def read_timeline_history(conn: Any, timeline: int) -> list[TimelineSwitch]:
    """The ancestors of ``timeline`` with their switch points (empty for timeline 1, which has no history file).

    Needs a superuser or EXECUTE on ``pg_read_binary_file(text)`` (module
    docstring); without it :class:`PrivilegeError`, never a guess.
    """
    if timeline <= 1:
        return []
    import psycopg2

    path = f"pg_wal/{timeline:08X}.history"
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT convert_from(pg_read_binary_file(%s), 'UTF8')", (path,))
            text = str(cur.fetchone()[0])
        conn.commit()
    except psycopg2.errors.InsufficientPrivilege:
        conn.rollback()
        raise PrivilegeError(
            f"reading the server's timeline history ({path}) needs a privilege this role lacks",
            f"{HISTORY_GRANT}; pgpoll will not guess whether the new timeline holds what the output does",
        ) from None
    except psycopg2.Error as exc:
        conn.rollback()
        raise SourceError(f"could not read the timeline history {path}: {str(exc).strip().splitlines()[0]}",
                          "check the server's pg_wal directory (a history file removed by hand?)") from None
    return parse_history(text)
