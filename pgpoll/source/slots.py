"""Replication slot access: create, drop, list, peek and advance.

This module is the only place that reads from or moves a slot. Every call
takes an open psycopg2 connection (autocommit) from
:func:`pgpoll.source.connection.connect`; slot names are checked with
:func:`pgpoll.source.names.check_slot_name` and always bound as parameters.

Every read runs in one transaction with the pinned settings
(:func:`pgpoll.source.session.pinned_transaction`): a peek and its
server-side cursor, an advance and the read of the slot it moves. Nothing
rests on session state, so a transaction pooler in front of the server
changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions

from pgpoll.errors import ConfigError, SlotInvalidatedError, SlotNotFoundError, WrongPluginError
from pgpoll.lsn import Lsn, lsn_or_none
from pgpoll.source.failover import FAILOVER_SINCE, slot_columns_sql
from pgpoll.source.names import check_slot_name, double_quote
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pinned_transaction
from pgpoll.source.waits import CallWatch, watched

PLUGINS = ("test_decoding", "pgoutput")
_make_lsn = int.__new__  # the server's LSNs need no range check
BINARY_PLUGINS = frozenset({"pgoutput"})


@dataclass(frozen=True)
class SlotInfo:
    """One row of ``pg_replication_slots`` with the lag pgpoll reports."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    safe_wal_size: int | None
    lag_bytes: int | None
    two_phase: bool = False
    # PostgreSQL 17+ (None before: pgpoll.source.failover); sync_ready is known on a standby only
    failover: bool | None = None
    synced: bool | None = None
    sync_ready: bool | None = None
    invalidation_reason: str | None = None
    conflicting: bool | None = None  # PostgreSQL 16+

    @property
    def safe_wal_size_shown(self) -> int | str | None:
        """``safe_wal_size`` for people: ``"unlimited"`` when NULL means no ``max_slot_wal_keep_size``.

        NULL also means a slot that lost its WAL; then it stays ``None``.
        """
        if self.safe_wal_size is None and self.wal_status in ("reserved", "extended"):
            return "unlimited"
        return self.safe_wal_size

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (LSNs as PostgreSQL text)."""
        return {
            "slot": self.name,
            "plugin": self.plugin,
            "slot_type": self.slot_type,
            "database": self.database,
            "active": self.active,
            "active_pid": self.active_pid,
            "restart_lsn": str(self.restart_lsn) if self.restart_lsn is not None else None,
            "confirmed_flush_lsn": str(self.confirmed_flush_lsn) if self.confirmed_flush_lsn is not None else None,
            "wal_status": self.wal_status,
            "safe_wal_size": self.safe_wal_size,
            "lag_bytes": self.lag_bytes,
            "two_phase": self.two_phase,
            "failover": self.failover,
            "synced": self.synced,
            "sync_ready": self.sync_ready,
            "invalidation_reason": self.invalidation_reason,
            "conflicting": self.conflicting,
        }


_SLOT_QUERY = """
SELECT slot_name, plugin, slot_type, database, active, active_pid,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
                       coalesce(confirmed_flush_lsn, restart_lsn))::bigint,
       two_phase, {failover_columns}
FROM pg_replication_slots
"""


def _slot_query(conn: Any) -> str:
    return _SLOT_QUERY.format(failover_columns=slot_columns_sql(conn.server_version))


def _row_to_info(row: tuple[Any, ...]) -> SlotInfo:
    return SlotInfo(
        name=row[0],
        plugin=row[1],
        slot_type=row[2],
        database=row[3],
        active=bool(row[4]),
        active_pid=row[5],
        restart_lsn=lsn_or_none(row[6]),
        confirmed_flush_lsn=lsn_or_none(row[7]),
        wal_status=row[8],
        safe_wal_size=row[9],
        lag_bytes=row[10],
        two_phase=bool(row[11]),
        failover=row[12],
        synced=row[13],
        sync_ready=row[14],
        invalidation_reason=row[15],
        conflicting=row[16],
    )


def list_slots(conn: Any) -> list[SlotInfo]:
    """Every replication slot on the server, by name."""
    try:
        with pinned_transaction(conn) as cur:
            cur.execute(_slot_query(conn) + " ORDER BY slot_name")
            return [_row_to_info(r) for r in cur.fetchall()]
    except psycopg2.Error as exc:
        raise translate(exc) from None


def _read_slot(cur: Any, name: str) -> SlotInfo:
    cur.execute(_slot_query(cur.connection) + " WHERE slot_name = %s", (name,))
    row = cur.fetchone()
    if row is None:
        raise SlotNotFoundError(
            f'replication slot "{name}" does not exist',
            f"create it with: pgpoll slot create {name} --plugin pgoutput (or test_decoding)",
        )
    return _row_to_info(row)


def get_slot(conn: Any, name: str) -> SlotInfo:
    """The slot ``name``; :class:`SlotNotFoundError` when it does not exist."""
    check_slot_name(name)
    try:
        with pinned_transaction(conn) as cur:
            return _read_slot(cur, name)
    except psycopg2.Error as exc:
        raise translate(exc, slot=name) from None


def check_usable(info: SlotInfo) -> SlotInfo:
    """Refuse a slot that lost the WAL it needs (``wal_status = lost``); return it otherwise."""
    if info.wal_status == "lost":
        raise SlotInvalidatedError(
            f'replication slot "{info.name}" has been invalidated (wal_status lost): the WAL it needed was removed',
            f"drop and recreate it (pgpoll slot drop {info.name}; pgpoll slot create {info.name} --plugin "
            f"{info.plugin}), then `pgpoll snapshot` the captured tables into a new output",
        )
    return info


def check_plugin(info: SlotInfo, plugin: str) -> str:
    """Resolve ``auto`` to the slot's plugin; refuse a mismatch or an unsupported plugin."""
    if info.slot_type != "logical":
        raise WrongPluginError(
            f'slot "{info.name}" is a physical slot', "create a logical slot: pgpoll slot create NAME --plugin pgoutput"
        )
    if plugin == "auto":
        plugin = info.plugin or ""
    if info.plugin != plugin:
        raise WrongPluginError(
            f'slot "{info.name}" uses plugin {info.plugin}, not {plugin}',
            f"pass --plugin {info.plugin} (or auto), or create a new slot with --plugin {plugin}",
        )
    if plugin not in PLUGINS:
        raise WrongPluginError(
            f'slot "{info.name}" uses plugin {plugin}, which pgpoll cannot read',
            "create a slot with --plugin pgoutput or --plugin test_decoding",
        )
    return plugin


def create_slot(
    conn: Any, name: str, plugin: str, *, two_phase: bool = False, failover: bool = False, watch: CallWatch | None = None,
) -> SlotInfo:
    """Create a logical slot; returns its row.

    ``failover`` (PostgreSQL 17+; :class:`ConfigError` before) makes a slot
    that a standby with ``sync_replication_slots`` keeps a copy of. The
    creation waits for every transaction running when it starts to end (its
    first snapshot), so it runs in a transaction of its own that first names
    its backend to ``watch`` (:mod:`pgpoll.source.waits`).
    """
    check_slot_name(name)
    if plugin not in PLUGINS:
        raise ConfigError(f"unknown plugin {plugin!r}", "use --plugin pgoutput or --plugin test_decoding")
    if failover and conn.server_version < FAILOVER_SINCE:
        version = conn.get_parameter_status("server_version") or str(conn.server_version)
        raise ConfigError(f"failover slots need PostgreSQL 17 or later; this server is {version}",
                          "create the slot without --failover (a failover then loses it), or upgrade the server")
    try:
        with pinned_transaction(conn, readonly=False) as cur, watched(watch, cur):
            cur.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s, false, %s"
                        + (", true)" if failover else ")"), (name, plugin, two_phase))
    except psycopg2.Error as exc:
        raise translate(exc, slot=name) from None
    return get_slot(conn, name)


def drop_slot(conn: Any, name: str, *, if_exists: bool = False) -> bool:
    """Drop the slot; returns False when it did not exist and ``if_exists`` is set."""
    check_slot_name(name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (name,))
            if cur.fetchone() is None:
                if if_exists:
                    return False
                raise SlotNotFoundError(
                    f'replication slot "{name}" does not exist', "check the name with: pgpoll slot list (or pass --if-exists)"
                )
            cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg2.Error as exc:
        raise translate(exc, slot=name) from None
    return True


@dataclass(frozen=True)
class AdvanceResult:
    """What :func:`advance_slot` did."""

    slot: str
    target: Lsn
    before: Lsn | None
    after: Lsn | None
    moved: bool


def advance_slot(conn: Any, name: str, target: Lsn, *, watch: CallWatch | None = None) -> AdvanceResult:
    """Move ``confirmed_flush_lsn`` to ``target``; idempotent.

    A target at or below the slot's confirmed position is a successful no-op
    (PostgreSQL itself raises an error for a target below it). A target past
    the end of WAL is clamped by the server. The slot is read and advanced in
    one transaction. ``watch`` reports a wait of the advance (a failover
    slot's waits for its standbys: :mod:`pgpoll.source.waits`).
    """
    if int(target) == 0:
        raise ConfigError("cannot advance a slot to 0/0", "give an LSN after the slot's position")
    check_slot_name(name)
    before: Lsn | None = None
    try:
        with pinned_transaction(conn, readonly=False) as cur:
            info = check_usable(_read_slot(cur, name))
            before = info.confirmed_flush_lsn
            if before is not None and target <= before:
                return AdvanceResult(name, target, before, before, False)
            with watched(watch, cur):
                cur.execute("SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)", (name, str(target)))
                row = cur.fetchone()
    except psycopg2.Error as exc:
        if "minimum is" in (getattr(exc, "pgerror", "") or ""):  # moved past target meanwhile
            after = get_slot(conn, name).confirmed_flush_lsn
            return AdvanceResult(name, target, before, after, False)
        raise translate(exc, slot=name) from None
    after = lsn_or_none(row[0]) if row else None
    return AdvanceResult(name, target, before, after, after != before)


def peek_options(plugin: str, *, publications: list[str] | None = None, proto_version: int = 1) -> list[str]:
    """The plugin options pgpoll passes to a peek, as a flat name/value list."""
    if plugin == "pgoutput":
        if not publications:
            raise ConfigError(
                "pgoutput needs a publication", "pass --publication NAME (create one with: pgpoll publication create)"
            )
        return [
            "proto_version", str(proto_version),
            # pgoutput splits publication_names with SplitIdentifierString: quote every name.
            "publication_names", ",".join(double_quote(p) for p in publications),
            "messages", "true",
        ]
    # No skip-empty-xacts: with it, test_decoding prints a transaction that holds
    # only a logical message (pgpoll's heartbeat) without its COMMIT row, and
    # COMMIT rows are the only safe positions to advance to.
    return ["include-xids", "1", "include-timestamp", "1"]


#: A full (64-bit) transaction id, read after the peek's result is built, to widen its ids against
#: (see :func:`peek_rows`).
_XID_REFERENCE = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text"


def peek_rows(
    conn: Any,
    name: str,
    plugin: str,
    *,
    upto_lsn: Lsn | None = None,
    upto_nchanges: int | None = None,
    options: list[str],
    itersize: int = 10000,
    raw_text: bool = False,
    on_xid_reference: Callable[[int], None] | None = None,
    watch: CallWatch | None = None,
) -> Generator[tuple[Lsn, int | None, Any], None, None]:
    """Stream ``(lsn, xid, data)`` rows of a peek through a server-side cursor.

    Never consumes: the slot does not move. ``data`` is ``str`` for
    test_decoding (``bytes`` when ``raw_text``, so the caller decides what
    to do with output that is not valid UTF-8) and ``memoryview`` for pgoutput.
    The peek and its server-side cursor run in one transaction with the
    pinned settings; the connection is left idle in its old autocommit mode,
    also when the caller stops early.

    ``xid`` is the row's 32-bit transaction id, as the plugins print it.
    ``on_xid_reference``, when given, is called once, before the first row,
    with ``pg_snapshot_xmax(pg_current_snapshot())`` (a full 64-bit id) read
    in the same transaction *after* the server built the peek's whole result
    (the first fetch decodes everything): the transactions the peek shows
    committed are below it (or, when their commit was flushed but not yet
    finished — a synchronous standby's wait — just above it), so the full id
    nearest it is theirs (:func:`pgpoll.xids.widen_xid`). The transaction runs
    READ COMMITTED whatever the connection's default, so the snapshot is the
    statement's own and not one taken before the peek.
    """
    for chunk in peek_chunks(
        conn, name, plugin, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges, options=options, itersize=itersize,
        raw_text=raw_text, on_xid_reference=on_xid_reference, watch=watch,
    ):
        for lsn, xid, data in chunk:
            yield _make_lsn(Lsn, lsn), xid, data


def peek_chunks(
    conn: Any,
    name: str,
    plugin: str,
    *,
    upto_lsn: Lsn | None = None,
    upto_nchanges: int | None = None,
    options: list[str],
    itersize: int = 10000,
    raw_text: bool = False,
    on_xid_reference: Callable[[int], None] | None = None,
    watch: CallWatch | None = None,
) -> Generator[list[tuple[int, int | None, Any]], None, None]:
    """:func:`peek_rows` a fetch at a time: lists of up to ``itersize`` rows, each LSN a plain ``int``.

    The ingest task's way in: no Python code runs per row here (the server
    gives each LSN as a number, ``lsn - '0/0'``, which psycopg2 reads in C),
    and the caller can decode a whole fetch at once. ``watch`` reports a
    wait of the server's decoding (:mod:`pgpoll.source.waits`).
    """
    func = "pg_logical_slot_peek_binary_changes" if plugin in BINARY_PLUGINS else "pg_logical_slot_peek_changes"
    placeholders = ", ".join(["%s"] * len(options))
    query = (
        f"SELECT (lsn - '0/0'::pg_lsn)::bigint, xid::text::bigint, data FROM {func}(%s, %s::pg_lsn, %s"
        + (", " + placeholders if options else "")
        + ")"
    )
    params: list[Any] = [name, str(upto_lsn) if upto_lsn is not None else None, upto_nchanges, *options]
    try:
        with _read_committed(conn if on_xid_reference is not None else None), \
                pinned_transaction(conn) as pinned, conn.cursor(name="pgpoll_peek") as cur:
            if raw_text:
                psycopg2.extensions.register_type(psycopg2.extensions.BYTES, cur)
            with watched(watch, pinned):
                cur.execute(query, params)
                chunk = cur.fetchmany(itersize)  # the server decodes the whole peek here
            if on_xid_reference is not None:
                pinned.execute(_XID_REFERENCE)
                on_xid_reference(int(pinned.fetchone()[0]))
            while chunk:
                yield chunk
                chunk = cur.fetchmany(itersize)
    except psycopg2.Error as exc:
        raise translate(exc, slot=name) from None


def xid_reference(conn: Any) -> int:
    """``pg_snapshot_xmax(pg_current_snapshot())`` read now, in a statement of its own (see :func:`peek_rows`)."""
    try:
        with _read_committed(conn), pinned_transaction(conn) as cur:
            cur.execute(_XID_REFERENCE)
            return int(cur.fetchone()[0])
    except psycopg2.Error as exc:
        raise translate(exc) from None


@contextmanager
def _read_committed(conn: Any) -> Iterator[None]:
    """Begin the next transaction on ``conn`` (when idle) READ COMMITTED; restore the old level after.

    psycopg2 sends the level with its ``BEGIN``: no session state, so a
    transaction pooler changes nothing. ``None``: nothing to do.
    """
    if conn is None or conn.get_transaction_status() != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
        yield
        return
    old = conn.isolation_level
    conn.isolation_level = psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED
    try:
        yield
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg2.Error):
                conn.isolation_level = old
