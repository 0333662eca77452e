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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
