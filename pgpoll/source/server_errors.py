"""Translate PostgreSQL errors (psycopg2 exceptions) into pgpoll's error hierarchy.

Also decides which errors are *transient* — worth a retry at an I/O edge:
a lost connection, an administrator's shutdown or termination, a server
starting up or in recovery. Nothing else is retried.
"""

from __future__ import annotations

import psycopg2

from pgpoll.errors import (
    ConnectionFailedError,
    PgpollError,
    PrivilegeError,
    PublicationNotFoundError,
    SlotBusyError,
    SlotExistsError,
    SlotInvalidatedError,
    SlotNotFoundError,
    SourceError,
    WalLevelError,
)
from pgpoll.source.connection import redact

# SQLSTATEs of failures that a new connection can get past.
TRANSIENT_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown (also pg_terminate_backend)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, shutting down, recovery)
        "08000",
        "08003",
        "08006",
        "08001",
        "08004",
    }
)


# SQLSTATEs of connection failures that no retry fixes: bad password, no such
# role or database, no CONNECT privilege, refused by pg_hba.conf, a startup
# parameter a pooler refuses (08P01).
PERMANENT_CONNECT_SQLSTATES = frozenset({"28P01", "28000", "3D000", "42501", "08P01"})


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry on a fresh connection can fix."""
    if isinstance(exc, ConnectionFailedError):
        return exc.sqlstate not in PERMANENT_CONNECT_SQLSTATES
    if isinstance(exc, psycopg2.Error):
        code = getattr(exc, "pgcode", None)
        if code in TRANSIENT_SQLSTATES:
            return True
        if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) and code is None:
            return not _is_permanent_login_failure(str(exc))
    return isinstance(exc, PgpollError) and exc.sqlstate in TRANSIENT_SQLSTATES


_PERMANENT_LOGIN = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",  # role or database
    "permission denied",
    "password is required",
    "invalid dsn",
    "could not translate host name",
)


def _is_permanent_login_failure(message: str) -> bool:
    low = message.lower()
    return any(p in low for p in _PERMANENT_LOGIN)


def _first_line(exc: BaseException) -> str:
    text = (getattr(exc, "pgerror", None) or str(exc) or type(exc).__name__).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if line.startswith("ERROR:"):
        line = line[len("ERROR:") :].strip()
    return redact(line)


def _detail(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    return (getattr(diag, "message_detail", None) or "") if diag is not None else ""


_INVALIDATED = (
    "can no longer get changes",  # PG 15-17, reading
    "can no longer access replication slot",  # PG 18
    "has been invalidated",
    "this slot has never previously reserved wal, or it has been invalidated",  # advance, PG 15-17
)


def _on_a_standby(msg: str, low: str, both: str, code: str | None) -> PgpollError | None:
    """What a hot standby refuses, with the fix (the how-to "Capture from a standby"); None for other errors.

    From the PostgreSQL source: a synced slot is not decoded during recovery
    (``CreateDecodingContext``, ``logical.c``); before 16 no logical decoding
    runs there (``CheckLogicalDecodingRequirements``); a failover slot is not
    created there (``ReplicationSlotCreate``, ``slot.c``); and nothing that
    writes runs there ("cannot assign TransactionIds during recovery",
    ``varsup.c``; a read-only transaction, 25006; "recovery is in progress"
    from the WAL position functions of ``xlogfuncs.c``).
    """
    if "being synchronized from the primary server" in both:
        return SourceError(msg, "a slot synced from the primary (a failover slot's copy) cannot be decoded on a standby "
                           "until it is promoted: create the standby's own slot there to capture from it, or capture "
                           "from the primary", sqlstate=code)
    if "logical decoding cannot be used while in recovery" in low:
        return SourceError(msg, "a standby decodes its own slots from PostgreSQL 16: capture from the primary",
                           sqlstate=code)
    if "cannot enable failover" in low and "standby" in low:
        return SourceError(msg, "create failover slots on the primary; a slot created on a standby cannot be one",
                           sqlstate=code)
    if code == "25006" or "during recovery" in low or "recovery is in progress" in low:
        return SourceError(msg, "the server is a hot standby (or the transaction read-only) and this needs the "
                           "primary: run this against the primary", sqlstate=code)
    return None


def translate(exc: BaseException, *, slot: str | None = None) -> PgpollError:
    """Map a psycopg2 error (or one that reads like it: ``pgcode``, ``pgerror``) to the most specific pgpoll error."""
    code = getattr(exc, "pgcode", None)
    msg = _first_line(exc)
    low = msg.lower()
    both = f"{low}\n{_detail(exc).lower()}"
    if code == "55006" or "is active for pid" in low:
        return SlotBusyError(
            f"slot {slot} is in use by another consumer: {msg}" if slot else f"slot in use by another consumer: {msg}",
            "wait for the other run to finish (or stop it), then try again",
            sqlstate=code,
        )
    if code == "42704" and "replication slot" in low:
        return SlotNotFoundError(msg, "create it with: pgpoll slot create NAME --plugin ...", sqlstate=code)
    if code == "42710" and "replication slot" in low:
        return SlotExistsError(msg, "choose another name, or drop the old slot: pgpoll slot drop NAME", sqlstate=code)
    if "wal_level" in low:
        where = "on the primary and restart it" if "on the primary" in low else "in postgresql.conf and restart the server"
        return WalLevelError(msg, f"set wal_level = logical {where}", sqlstate=code)
    if any(marker in both for marker in _INVALIDATED):
        return SlotInvalidatedError(
            msg,
            "the slot lost WAL it needed: drop and recreate it, then `pgpoll snapshot` the captured tables into a new output",
            sqlstate=code,
        )
    standby = _on_a_standby(msg, low, both, code)
    if standby is not None:
        return standby
    if "was not created in this database" in low:
        return SourceError(
            msg, "connect to the slot's database (see the database column of: pgpoll slot list)", sqlstate=code
        )
    if "must be owner of" in low:
        return PrivilegeError(
            msg,
            "publications are created by the tables' owner (or a superuser); see sql/least_privilege.sql",
            sqlstate=code,
        )
    if code == "42501" or "permission denied" in low or "must be superuser or replication role" in low:
        return PrivilegeError(
            msg,
            "grant the role REPLICATION (ALTER ROLE name REPLICATION) and SELECT on the captured tables; "
            "see sql/least_privilege.sql",
            sqlstate=code,
        )
    if code == "42704" and "publication" in low:
        return PublicationNotFoundError(msg, "create it: pgpoll publication create NAME --table ...", sqlstate=code)
    if code == "42710":
        return SourceError(msg, "choose another name, or drop the existing one first", sqlstate=code)
    if code == "42P01":
        return SourceError(
            msg, 'check the table name: unquoted names fold to lower case; double-quote others, e.g. \'"My Table"\'',
            sqlstate=code,
        )
    if code == "42703":
        return SourceError(msg, "check the column names (double-quote names with upper case or other characters)", sqlstate=code)
    if code == "58P01" or "could not access file" in low:
        return SourceError(
            msg, "the output plugin is not installed on the server; install it or use --plugin pgoutput", sqlstate=code
        )
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) or (code or "").startswith(("08", "57P")):
        return ConnectionFailedError(
            f"lost the connection to the server: {msg}",
            "check that the server is up and reachable, then run again",
            sqlstate=code,
        )
    return SourceError(msg, "see the server log for details", sqlstate=code)
