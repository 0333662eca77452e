"""The one error hierarchy of pgpoll.

Every error pgpoll raises on purpose derives from :class:`PgpollError`. The
library never exits; the CLI boundary (``pgpoll.cli.exitcodes``) maps each
class to a documented exit code. Messages are one or two lines: what failed,
then how to fix it. Errors pickle cleanly (Spark ships them between
processes), so every attribute is passed through ``__init__``.
"""

from __future__ import annotations

from typing import Any


class PgpollError(Exception):
    """Base of every error pgpoll raises on purpose.

    Parameters
    ----------
    message:
        What failed, in one line.
    hint:
        How to fix it, in one line (optional).
    lsn, relation, message_type, sqlstate:
        Context where known.
    """

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        lsn: str | None = None,
        relation: str | None = None,
        message_type: str | None = None,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.lsn = lsn
        self.relation = relation
        self.message_type = message_type
        self.sqlstate = sqlstate

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.hint,
                {
                    "lsn": self.lsn,
                    "relation": self.relation,
                    "message_type": self.message_type,
                    "sqlstate": self.sqlstate,
                },
                dict(self.__dict__),
            ),
        )

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  fix: {self.hint}"
        return self.message


def _rebuild(
    cls: type[PgpollError],
    message: str,
    hint: str | None,
    context: dict[str, Any],
    state: dict[str, Any],
) -> PgpollError:
    err = cls.__new__(cls)
    PgpollError.__init__(err, message, hint, **context)
    err.__dict__.update(state)
    return err


class ConfigError(PgpollError):
    """Bad usage or configuration: a bad option, name, DSN or filter."""


class SlotBusyError(PgpollError):
    """Another consumer holds the slot (or pgpoll's lock for it)."""


class FenceLostError(SlotBusyError):
    """Another run published the commit-log record this run's batch was planned for.

    The batch's staging is removed and the slot is not advanced; batches the
    run committed before stay committed. Exits like a busy slot.
    """


class SourceError(PgpollError):
    """A precondition on the PostgreSQL side does not hold."""


class SlotNotFoundError(SourceError):
    """The replication slot does not exist."""


class PublicationNotFoundError(SourceError):
    """The publication does not exist."""


class WrongPluginError(SourceError):
    """The slot uses another output plugin than the one asked for."""


class WalLevelError(SourceError):
    """``wal_level`` is not ``logical``."""


class PrivilegeError(SourceError):
    """The role lacks a privilege pgpoll needs."""


class SlotInvalidatedError(SourceError):
    """The slot lost required WAL (``wal_status = lost``) and must be recreated."""


class SlotMovedError(SourceError):
    """The slot was advanced past the position a reader still needs (a Spark stream's batch start).

    Someone else consumed the slot (another query, ``pgpoll ingest``, an
    administrator's ``pg_replication_slot_advance``), or the checkpoint the
    query restarted from is older than the one the slot was advanced for (a
    lost or restored checkpoint). The changes in between are gone from the
    slot; reading on would skip them silently.
    """


class SlotGapError(SourceError):
    """The slot and the output disagree: reading on would lose changes or keep changes the server never had.

    The slot is past the output's high-water mark (dropped and recreated,
    consumed by another reader, advanced by hand: the changes in between were
    never written), or it is at or behind the mark on another server or on a
    timeline that left the output's before the mark (a failover to a standby
    that had not received everything the output read). Checked before a run
    reads anything (:mod:`pgpoll.source.slot_gap`): nothing is written and
    the slot is not moved.
    """


class StandbyWaitError(SourceError):
    """A call on a failover slot waited on ``synchronized_standby_slots`` for a slot that cannot confirm, and was cancelled.

    PostgreSQL 17+ makes a failover slot's peek and advance wait until every
    physical slot named in ``synchronized_standby_slots`` has confirmed the WAL
    read, with no end; a slot named there that is missing, invalidated or
    inactive never does (:mod:`pgpoll.source.waits`).
    """


class SlotExistsError(SourceError):
    """A slot of that name already exists."""


class ConnectionFailedError(SourceError):
    """The server could not be reached or refused the login."""


class LockTimeoutError(SourceError):
    """A snapshot read could not take its ACCESS SHARE lock within ``lock_timeout``.

    ``table`` is the table; ``blocker_pid``, ``blocker_application`` and
    ``blocker_since`` (ISO text) describe the session holding or queueing the
    conflicting lock, where it could be seen.
    """

    table: str | None = None
    blocker_pid: int | None = None
    blocker_application: str | None = None
    blocker_since: str | None = None


class SharedSnapshotLostError(SourceError):
    """A chunk could not import the shared (exported) snapshot: the exporting session ended."""


class TableRewrittenError(SourceError):
    """A table was rewritten (TRUNCATE, VACUUM FULL, a rewriting ALTER TABLE) after its shared snapshot was taken.

    Such commands are not MVCC-safe: a read through the older snapshot would
    see the new files. The table's shared read starts again under a new one.
    """


class SinkError(PgpollError):
    """The output could not be written or committed."""


class DecodeError(PgpollError):
    """Plugin output could not be parsed.

    ``offset`` is the byte (pgoutput) or character (test_decoding) offset
    where decoding failed, where known.
    """

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        offset: int | None = None,
        lsn: str | None = None,
        relation: str | None = None,
        message_type: str | None = None,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(
            message,
            hint,
            lsn=lsn,
            relation=relation,
            message_type=message_type,
            sqlstate=sqlstate,
        )
        self.offset = offset


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text (at most ``limit`` characters), or its type's name.

    Driver and JVM errors carry pages of detail; a pgpoll message keeps one line of it
    (for a py4j error, the Java exception's message rather than py4j's wrapper text).
    """
    java = getattr(exc, "java_exception", None)  # a py4j error: the Java exception's own message
    if java is not None:
        try:
            return str(java.toString())[:limit]
        except Exception:  # pragma: no cover - a dead gateway: fall back to the Python text
            pass
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text and text[0].strip() else type(exc).__name__
