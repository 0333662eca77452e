"""Preflight checks of a source server: what ``pgpoll check`` reports.

Each check yields a :class:`CheckItem` with a status (``ok``, ``warn``,
``fail``), the value seen and the fix. The CLI prints them as a table and
exits 4 when any check fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg2

from pgpoll.errors import PrivilegeError, PublicationNotFoundError, SourceError, WalLevelError, first_line
from pgpoll.source.names import quote_ident
from pgpoll.source.publication_identity import COLUMN_LIST, NO_IDENTITY, ROW_FILTER, identity_problems
from pgpoll.source.server_errors import translate

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class CheckItem:
    """One preflight check."""

    name: str
    status: str
    value: str
    fix: str = ""
    error: type[SourceError] | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"check": self.name, "status": self.status, "value": self.value, "fix": self.fix}


def _setting(cur: Any, name: str) -> str:
    cur.execute("SELECT current_setting(%s, true)", (name,))
    row = cur.fetchone()
    return row[0] if row and row[0] is not None else ""


def run_checks(conn: Any, *, plugin: str | None = None, publication: str | None = None) -> list[CheckItem]:
    """Run every check against the connected server."""
    try:
        return _run_checks(conn, plugin, publication)
    except psycopg2.Error as exc:
        raise translate(exc) from None


def _run_checks(conn: Any, plugin: str | None, publication: str | None) -> list[CheckItem]:
    items: list[CheckItem] = []
    with conn.cursor() as cur:
        version_num = int(_setting(cur, "server_version_num") or 0)
        version = _setting(cur, "server_version")
        items.append(
            CheckItem("server version", OK if version_num >= 150000 else WARN, version,
                      "" if version_num >= 150000 else "pgpoll is tested on PostgreSQL 15 to 18; upgrade the server")
        )
        wal_level = _setting(cur, "wal_level")
        items.append(
            CheckItem(
                "wal_level",
                OK if wal_level == "logical" else FAIL,
                wal_level,
                "" if wal_level == "logical"
                else "set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server",
                None if wal_level == "logical" else WalLevelError,
            )
        )
        max_slots = int(_setting(cur, "max_replication_slots") or 0)
        cur.execute("SELECT count(*) FROM pg_replication_slots")
        used = int(cur.fetchone()[0])
        free = max_slots - used
        items.append(
            CheckItem("free replication slots", OK if free > 0 else FAIL, f"{free} of {max_slots}",
                      "" if free > 0 else "raise max_replication_slots and restart, or drop unused slots (pgpoll slot list)",
                      None if free > 0 else SourceError)
        )
        max_senders = int(_setting(cur, "max_wal_senders") or 0)
        cur.execute("SELECT count(*) FROM pg_stat_replication")
        senders_used = int(cur.fetchone()[0])
        items.append(
            CheckItem("free wal senders", OK if max_senders - senders_used > 0 else WARN,
                      f"{max_senders - senders_used} of {max_senders}",
                      "" if max_senders - senders_used > 0
                      else "pgpoll's SQL interface needs none, but pg_recvlogical does: raise max_wal_senders")
        )
        cur.execute("SELECT current_user, rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user")
        user, is_super, is_repl = cur.fetchone()
        priv_ok = bool(is_super or is_repl)
        items.append(
            CheckItem(
                "role can use slots",
                OK if priv_ok else FAIL,
                f"{user} ({'superuser' if is_super else 'replication' if is_repl else 'no REPLICATION'})",
                "" if priv_ok else f"as a superuser: ALTER ROLE {quote_ident(user)} REPLICATION (see sql/least_privilege.sql)",
                None if priv_ok else PrivilegeError,
            )
        )
        keep = _setting(cur, "max_slot_wal_keep_size")
        items.append(
            CheckItem("max_slot_wal_keep_size", WARN if keep in ("-1", "") else OK, keep or "unknown",
                      "unlimited: a stalled slot can fill the disk; set a limit and monitor wal_status"
                      if keep in ("-1", "") else "")
        )
        cur.execute("SELECT pg_is_in_recovery()")
        standby = bool(cur.fetchone()[0])
    if plugin:
        items.append(_check_plugin(conn, plugin, wal_level == "logical" and priv_ok, standby))
    if publication:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
            exists = cur.fetchone() is not None
        items.append(
            CheckItem(f"publication {publication}", OK if exists else FAIL, "exists" if exists else "missing",
                      "" if exists else "create it: pgpoll publication create NAME --table schema.tbl",
                      None if exists else PublicationNotFoundError)
        )
        if exists:
            items.extend(_identity_checks(conn, publication))
    return items


_ITEM_NAMES = {NO_IDENTITY: "replica identity", COLUMN_LIST: "column list", ROW_FILTER: "row filter"}


def _identity_checks(conn: Any, publication: str) -> list[CheckItem]:
    """A failed check per table whose UPDATE or DELETE the publication makes fail on the source.

    See :mod:`pgpoll.source.publication_identity`: no usable replica identity,
    a column list that does not cover it, a row filter reading other columns.
    """
    with conn.cursor() as cur:
        problems = identity_problems(cur, publication)
    return [
        CheckItem(f"{_ITEM_NAMES[p.kind]} of {p.table}", FAIL, f"{p.detail}: {p.statements} fail",
                  p.fix(publication, for_create=False), SourceError)
        for p in problems
    ]


def _check_plugin(conn: Any, plugin: str, can_probe: bool, standby: bool) -> CheckItem:
    """The plugin is built in (pgoutput) or a probe slot can be made with it.

    Not on a hot standby: a slot created there waits for a running-transactions
    record from the primary (none comes while the primary is idle), so the probe
    could wait for ever.
    """
    if plugin == "pgoutput":
        return CheckItem("plugin pgoutput", OK, "built in")
    if standby:
        return CheckItem(f"plugin {plugin}", WARN, "not checked on a hot standby",
                         "a probe slot would wait for the primary: check it on the primary")
    if not can_probe:
        return CheckItem(f"plugin {plugin}", WARN, "not checked", "fix the failures above first")
    try:
        with conn.cursor() as cur:
            # One statement: behind a transaction pooler two would run on different server connections.
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_create_logical_replication_slot("
                        "'pgpoll_check_probe_' || pg_backend_pid(), %s, true)", (plugin,))
    except psycopg2.Error as exc:
        first = first_line(exc)
        return CheckItem(f"plugin {plugin}", FAIL, first,
                         f"install {plugin} on the server (Debian: postgresql-contrib) or use --plugin pgoutput", SourceError)
    return CheckItem(f"plugin {plugin}", OK, "available")
