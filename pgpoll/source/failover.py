"""Failover slots (PostgreSQL 17+): their columns per version, ``synchronized_standby_slots``, readiness.

Why a module of its own: what a slot says about failover differs by server
version, and two callers need the same reading of ``synchronized_standby_slots``
(``pgpoll check``, and :mod:`pgpoll.source.waits`, which cancels a peek that
waits on a slot named there that cannot confirm).

``pg_replication_slots`` by version (PostgreSQL's ``system_views.sql``):
15 has ``temporary``, ``wal_status``, ``two_phase``; 16 adds ``conflicting``
(a logical slot invalidated by a recovery conflict, on a standby); 17 adds
``inactive_since``, ``invalidation_reason``, ``failover`` and ``synced``; 18
keeps them (and adds ``two_phase_at``). A synced slot on a standby is
"sync-ready" (usable after promotion) once the slot sync worker has persisted
it: ``synced AND NOT temporary`` and not invalidated (the query PostgreSQL's
"Logical Replication Failover" chapter gives). On a primary the standby's copy
is not visible, so that is unknown (None) there.

A hot standby can also decode slots of its own (PostgreSQL 16+):
:func:`standby_capture_checks` says what ``pgpoll check`` reports of that,
with the same reading of the slot's columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from pgpoll.errors import SourceError
from pgpoll.source.preflight import FAIL, OK, WARN, CheckItem
from pgpoll.source.server_errors import translate

#: PostgreSQL 17: failover slots, ``synchronized_standby_slots``, ``sync_replication_slots``.
FAILOVER_SINCE = 170000
#: PostgreSQL 16: ``pg_replication_slots.conflicting``.
CONFLICTING_SINCE = 160000


def slot_columns_sql(server_version: int) -> str:
    """The select list, after pgpoll's common columns, of ``failover, synced, sync_ready, invalidation_reason, conflicting``.

    Columns a version lacks come as NULL, so one row shape serves 15-18.
    """
    if server_version >= FAILOVER_SINCE:
        return ("failover, synced, CASE WHEN synced THEN NOT temporary AND invalidation_reason IS NULL END, "
                "invalidation_reason, conflicting")
    if server_version >= CONFLICTING_SINCE:
        return "NULL::bool, NULL::bool, NULL::bool, NULL::text, conflicting"
    return "NULL::bool, NULL::bool, NULL::bool, NULL::text, NULL::bool"


def standby_slot_names(value: str) -> list[str]:
    """The slot names of a ``synchronized_standby_slots`` value, as the server splits it.

    The server reads the list with ``SplitIdentifierString``: names separated
    by commas, a double-quoted name kept as written (``""`` is one quote),
    an unquoted one folded to lower case and stripped of blanks.
    """
    names: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        if value[i] == '"':
            out: list[str] = []
            i += 1
            while i < n:
                if value[i] == '"':
                    if i + 1 < n and value[i + 1] == '"':
                        out.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                out.append(value[i])
                i += 1
            names.append("".join(out))
            while i < n and value[i] != ",":
                i += 1
        else:
            j = value.find(",", i)
            j = n if j < 0 else j
            word = value[i:j].strip()
            if word:
                names.append(word.lower())
            i = j
    return names


@dataclass(frozen=True)
class StandbySlot:
    """One slot named in ``synchronized_standby_slots`` as the primary sees it (``exists`` False: no such slot)."""

    name: str
    exists: bool
    slot_type: str | None = None
    active: bool = False
    invalidated: str | None = None  # wal_status lost, or the 17+ invalidation_reason

    @property
    def problem(self) -> str | None:
        """Why this slot cannot confirm WAL to a failover slot's reader (None: it can, or will)."""
        if not self.exists:
            return f'replication slot "{self.name}" does not exist'
        if self.slot_type != "physical":
            return f'replication slot "{self.name}" is a {self.slot_type} slot, not a standby\'s physical slot'
        if self.invalidated:
            return f'replication slot "{self.name}" is invalidated ({self.invalidated})'
        if not self.active:
            return f'replication slot "{self.name}" is not active (no standby streams from it)'
        return None


def standby_slots(cur: Any) -> tuple[str, list[StandbySlot]]:
    """``synchronized_standby_slots`` (raw text) and each slot it names; ``("", [])`` before 17 or when unset."""
    cur.execute("SELECT current_setting('synchronized_standby_slots', true)")
    row = cur.fetchone()
    raw = (row[0] if row else None) or ""
    names = standby_slot_names(raw)
    if not names:
        return raw, []
    reason = ("coalesce(invalidation_reason, CASE WHEN wal_status = 'lost' THEN 'wal_status lost' END)"
              if cur.connection.server_version >= FAILOVER_SINCE else "CASE WHEN wal_status = 'lost' THEN 'wal_status lost' END")
    cur.execute(f"SELECT slot_name, slot_type, active, {reason} FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                (names,))
    seen = {r[0]: StandbySlot(r[0], True, r[1], bool(r[2]), r[3]) for r in cur.fetchall()}
    return raw, [seen.get(name, StandbySlot(name, False)) for name in names]


def failover_checks(conn: Any, slot: str | None = None) -> list[CheckItem]:
    """What ``pgpoll check`` reports of failover readiness (PostgreSQL 17+; nothing before).

    On a primary: ``synchronized_standby_slots`` names physical slots that
    exist and are active (unset while failover slots exist: a warning, since a
    failover slot's changes can then be read before any standby has them),
    and ``slot``, when given, is a failover slot. On a standby: the settings
    slot synchronization needs (``sync_replication_slots``,
    ``hot_standby_feedback``, ``primary_slot_name``, a ``dbname`` in
    ``primary_conninfo``) and whether each synced slot is sync-ready.
    Readiness problems are warnings on a standby (not every standby is a
    failover target) and failures on a primary (a named standby slot that
    cannot confirm makes every peek of a failover slot wait).
    """
    try:
        if conn.server_version < FAILOVER_SINCE:
            return []
        with conn.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            standby = bool(cur.fetchone()[0])
            return _standby_checks(cur) if standby else _primary_checks(cur, slot)
    except psycopg2.Error as exc:
        raise translate(exc) from None


def _primary_checks(cur: Any, slot: str | None) -> list[CheckItem]:
    items: list[CheckItem] = []
    cur.execute("SELECT slot_name, failover FROM pg_replication_slots WHERE slot_type = 'logical' "
                "AND database = current_database() ORDER BY slot_name")
    logical = dict(cur.fetchall())
    raw, slots = standby_slots(cur)
    failover_slots = [name for name, failover in logical.items() if failover]
    if slots:
        problems = [p for p in (s.problem for s in slots) if p]
        items.append(CheckItem(
            "synchronized_standby_slots", FAIL if problems else OK, "; ".join(problems) or f"{raw} (active)",
            "" if not problems else "create the standby's physical slot and let it stream, or remove the name from "
            "synchronized_standby_slots: until then every peek of a failover slot waits", SourceError if problems else None))
    elif failover_slots:
        items.append(CheckItem(
            "synchronized_standby_slots", WARN, "unset",
            "set it to the failover standbys' physical slots: without it pgpoll can read changes no standby has, "
            "which a failover then loses from the server but not from the output"))
    if slot is not None:
        failover = logical.get(slot)
        items.append(CheckItem(
            f"failover slot {slot}", OK if failover else WARN,
            "missing" if failover is None else "yes" if failover else "no",
            "" if failover else f"a failover loses this slot: pgpoll slot create {slot} --failover (a new slot: see "
            "the how-to 'Survive a failover')"))
    elif failover_slots:
        items.append(CheckItem("failover slots", OK, ", ".join(failover_slots)))
    return items


def _standby_checks(cur: Any) -> list[CheckItem]:
    items: list[CheckItem] = []
    for name, want, fix in (
        ("sync_replication_slots", "on", "ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf()"),
        ("hot_standby_feedback", "on", "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf()"),
    ):
        value = _setting(cur, name)
        why = "for failover slots to be synced here" + (
            ", and for a slot created here to keep the catalog rows it needs" if name == "hot_standby_feedback" else "")
        items.append(CheckItem(name, OK if value == want else WARN, value or "unknown",
                               "" if value == want else f"{why}: {fix}"))
    slot_name = _setting(cur, "primary_slot_name")
    items.append(CheckItem("primary_slot_name", OK if slot_name else WARN, slot_name or "unset",
                           "" if slot_name else "stream from a physical slot on the primary (and name it in the primary's "
                           "synchronized_standby_slots)"))
    conninfo = _setting(cur, "primary_conninfo")
    dbname = _conninfo_dbname(conninfo) if conninfo is not None else None
    items.append(CheckItem(
        "dbname in primary_conninfo", OK if dbname else WARN,
        dbname or ("unreadable (needs superuser or pg_read_all_settings)" if conninfo is None else "missing"),
        "" if dbname else "add dbname=... to primary_conninfo: the slot sync worker connects to a database"))
    cur.execute("SELECT slot_name, NOT temporary AND invalidation_reason IS NULL FROM pg_replication_slots "
                "WHERE synced ORDER BY slot_name")
    for name, ready in cur.fetchall():
        items.append(CheckItem(
            f"synced slot {name}", OK if ready else WARN, "sync-ready" if ready else "not sync-ready",
            "" if ready else "a promotion now loses it: the primary's slot must first move past this copy's "
                             "restart_lsn and catalog_xmin (run ingest on the primary, then look again)"))
    return items


def _setting(cur: Any, name: str) -> str | None:
    """A setting's value; None when this role may not read it (``primary_conninfo`` is superuser-only).

    The check's connection is in autocommit: a refused read spoils nothing.
    """
    try:
        cur.execute("SELECT current_setting(%s, true)", (name,))
    except psycopg2.errors.InsufficientPrivilege:
        return None
    row = cur.fetchone()
    return str(row[0]) if row and row[0] is not None else ""


def _conninfo_dbname(conninfo: str) -> str | None:
    """The ``dbname`` of a conninfo string (never anything else of it: it may hold a password)."""
    try:
        return psycopg2.extensions.parse_dsn(conninfo).get("dbname") if conninfo else None
    except psycopg2.ProgrammingError:
        return None


def standby_capture_checks(conn: Any, slot: str | None = None) -> list[CheckItem]:
    """What ``pgpoll check`` reports of capture from a hot standby (nothing on a primary).

    Logical decoding on a standby needs PostgreSQL 16 (before, slot creation
    there fails: "logical decoding cannot be used while in recovery"). A
    slot created there needs ``hot_standby_feedback`` (its ``catalog_xmin``
    reaches the primary's vacuum; without it replaying a removal of catalog
    rows it needs invalidates it: ``ResolveRecoveryConflictWithSnapshot`` in
    ``standby.c``, ``rows_removed``) and a physical slot on the primary
    (``primary_slot_name``: it keeps that horizon while the standby is away);
    17+ reports both in :func:`failover_checks`, so here they are for 16 only.
    With ``slot``: it must be the standby's own slot, neither a synced copy
    ("cannot use replication slot ... for logical decoding: This replication
    slot is being synchronized from the primary server", ``CreateDecodingContext``
    in ``logical.c``) nor invalidated.
    """
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            if not cur.fetchone()[0]:
                return []
            version = int(conn.server_version)
            if version < CONFLICTING_SINCE:
                return [CheckItem("logical decoding on this standby", FAIL, f"PostgreSQL {version // 10000}",
                                  "a standby decodes its own slots from PostgreSQL 16: capture from the primary",
                                  SourceError)]
            items: list[CheckItem] = []
            if version < FAILOVER_SINCE:
                feedback, slot_name = _setting(cur, "hot_standby_feedback"), _setting(cur, "primary_slot_name")
                items.append(CheckItem(
                    "hot_standby_feedback", OK if feedback == "on" else WARN, feedback or "unknown",
                    "" if feedback == "on" else "a slot created here is invalidated when the primary's vacuum removes "
                    "catalog rows it needs: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf()"))
                items.append(CheckItem(
                    "primary_slot_name", OK if slot_name else WARN, slot_name or "unset",
                    "" if slot_name else "stream from a physical slot on the primary: it keeps the feedback's "
                    "horizon while this standby is disconnected"))
            if slot is not None:
                items.append(_standby_slot_item(cur, slot, version))
            return items
    except psycopg2.Error as exc:
        raise translate(exc) from None


def _standby_slot_item(cur: Any, slot: str, version: int) -> CheckItem:
    name = f"slot {slot} on this standby"
    cur.execute(f"SELECT slot_type, {slot_columns_sql(version)} FROM pg_replication_slots WHERE slot_name = %s",
                (slot,))
    row = cur.fetchone()
    if row is None:
        return CheckItem(name, WARN, "missing", f"create it here: pgpoll slot create {slot} --plugin pgoutput (see the "
                         "how-to 'Capture from a standby')")
    slot_type, _failover, synced, _ready, reason, conflicting = row
    if slot_type != "logical":
        return CheckItem(name, FAIL, f"a {slot_type} slot", "give a logical slot (pgpoll slot list)", SourceError)
    if synced:
        return CheckItem(name, FAIL, "synced from the primary",
                         "a synced failover slot cannot be decoded on a standby (only after a promotion): create the "
                         "standby's own slot to capture here, or capture from the primary", SourceError)
    if reason is not None or conflicting:
        return CheckItem(name, FAIL, f"invalidated ({reason or 'conflicting'})",
                         "set hot_standby_feedback = on and primary_slot_name, then drop and recreate the slot: see the "
                         "how-to 'Recover from a lost or moved slot'", SourceError)
    return CheckItem(name, OK, "the standby's own slot")
