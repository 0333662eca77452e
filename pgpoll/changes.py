"""pgpoll's change model: what both plugin decoders produce.

Decoders turn one plugin output row into one *event* (``Begin``, ``Commit``,
``RowChange``, ...). Events carry the row's ``lsn`` where the caller knows it
(the ``lsn`` column of the peek) and the transaction id where the plugin gives
it. The transaction assembler (``pgpoll.decode.assembler``) groups events into
committed transactions and emits one :class:`ChangeRecord` per change: the
envelope written to Parquet.

Values are PostgreSQL's text form of each value: what the type's output
function prints under pgpoll's session settings (as psql shows it, and
``col::text`` for nearly every type — ``inet``'s cast adds the netmask),
with booleans as ``true``/``false`` from both plugins. SQL NULL is ``None``.
Everything is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Mapping, Optional, Union


class Op(str, Enum):
    """The ``op`` column: one letter per kind of change."""

    INSERT = "I"
    UPDATE = "U"
    DELETE = "D"
    TRUNCATE = "T"
    MESSAGE = "M"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a relation as the plugin describes it.

    ``type_name`` is test_decoding's printed type (``character varying[]``);
    ``type_oid``/``type_modifier`` come from pgoutput's Relation message.
    ``is_key`` is pgoutput's flag "part of the replica identity key".
    """

    name: str
    type_name: Optional[str] = None
    type_oid: Optional[int] = None
    type_modifier: Optional[int] = None
    is_key: bool = False


# ---- transaction framing -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction. ``final_lsn`` is the commit record's start (pgoutput)."""

    xid: Optional[int]
    lsn: Optional[int] = None
    final_lsn: Optional[int] = None
    commit_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction. ``end_lsn`` is the commit record's end.

    For the SQL interface the COMMIT row's ``lsn`` equals ``end_lsn``; the
    assembler uses the row ``lsn`` when known, else ``end_lsn``.
    """

    xid: Optional[int]
    lsn: Optional[int] = None
    commit_lsn: Optional[int] = None
    end_lsn: Optional[int] = None
    commit_ts: Optional[datetime] = None


# ---- changes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowChange:
    """An INSERT, UPDATE or DELETE of one row.

    ``before`` is the old row (DELETE; UPDATE when the plugin sent it), ``after``
    the new row (INSERT, UPDATE). ``before_is_key`` is True when ``before`` holds
    only the replica-identity key columns. ``unchanged_toast`` names the columns
    whose unchanged TOASTed value was not sent (they are absent from ``after``).
    """

    op: Op
    schema: str
    table: str
    columns: tuple[Column, ...]
    before: Optional[Mapping[str, Optional[str]]]
    after: Optional[Mapping[str, Optional[str]]]
    unchanged_toast: tuple[str, ...] = ()
    before_is_key: bool = False
    xid: Optional[int] = None
    lsn: Optional[int] = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """TRUNCATE of one or more tables (one event, as the plugins send it)."""

    relations: tuple[tuple[str, str], ...]
    cascade: bool = False
    restart_identity: bool = False
    xid: Optional[int] = None
    lsn: Optional[int] = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` record."""

    transactional: bool
    prefix: str
    content: bytes
    xid: Optional[int] = None
    lsn: Optional[int] = None


# ---- streaming and two-phase framing --------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A chunk of an in-progress transaction begins."""

    xid: int
    first_segment: bool = False
    lsn: Optional[int] = None


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The current streamed chunk ends."""

    lsn: Optional[int] = None


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """A streamed transaction committed: its buffered chunks become committed changes."""

    xid: int
    lsn: Optional[int] = None
    commit_lsn: Optional[int] = None
    end_lsn: Optional[int] = None
    commit_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed (sub)transaction aborted: drop what was buffered for ``subxid``."""

    xid: int
    subxid: int
    lsn: Optional[int] = None
    abort_lsn: Optional[int] = None
    abort_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """Start of a transaction prepared for two-phase commit."""

    xid: Optional[int]
    gid: Optional[str] = None
    lsn: Optional[int] = None
    prepare_lsn: Optional[int] = None
    end_lsn: Optional[int] = None
    prepare_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class Prepare:
    """PREPARE TRANSACTION (also pgoutput's Stream Prepare)."""

    xid: Optional[int]
    gid: Optional[str]
    lsn: Optional[int] = None
    prepare_lsn: Optional[int] = None
    end_lsn: Optional[int] = None
    prepare_ts: Optional[datetime] = None
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """COMMIT PREPARED 'gid'."""

    xid: Optional[int]
    gid: Optional[str]
    lsn: Optional[int] = None
    commit_lsn: Optional[int] = None
    end_lsn: Optional[int] = None
    commit_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """ROLLBACK PREPARED 'gid'."""

    xid: Optional[int]
    gid: Optional[str]
    lsn: Optional[int] = None
    prepare_end_lsn: Optional[int] = None
    rollback_end_lsn: Optional[int] = None
    prepare_ts: Optional[datetime] = None
    rollback_ts: Optional[datetime] = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """A row with no change in it (pgoutput Relation, Type, Origin...)."""

    kind: str
    lsn: Optional[int] = None


Event = Union[
    Begin,
    Commit,
    RowChange,
    Truncate,
    LogicalMessage,
    StreamStart,
    StreamStop,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    Ignored,
]


# ---- the envelope ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One committed change as written to Parquet (the change envelope).

    ``commit_lsn`` is the end LSN of the transaction's commit record (the COMMIT
    row's ``lsn``); ``seq`` is the 0-based ordinal of the change within its
    transaction, so ``(commit_lsn, seq)`` is unique and orders every change.
    Changes outside a transaction (non-transactional messages) have
    ``commit_lsn = lsn``, ``seq = 0`` and no ``xid``/``commit_ts``.
    """

    commit_lsn: Optional[int]
    lsn: Optional[int]
    seq: int
    xid: Optional[int]
    commit_ts: Optional[datetime]
    op: Op
    schema_name: Optional[str] = None
    table_name: Optional[str] = None
    before: Optional[Mapping[str, Optional[str]]] = None
    after: Optional[Mapping[str, Optional[str]]] = None
    unchanged_toast: tuple[str, ...] = field(default=())
    message_prefix: Optional[str] = None
    message_content: Optional[bytes] = None
    transactional: Optional[bool] = None
