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
Everything is immutable, except the value lists of the fast row shape.

Besides the events there is one lighter shape for row changes,
:data:`RowFields`: a plain tuple that a decoder's fast path hands straight to
the batch assembler, with the values as a list in the order of a
:class:`RelationInfo`. It is plugin-neutral (no wire detail in it), and
:func:`split_row` is the one place that turns it into names and values, so the
unchanged-TOAST and replica-identity-key rules live here once. It is a tuple
and not a NamedTuple because building one is the per-row cost of the fast
path (a NamedTuple costs several times a tuple); the ``ROW_*`` constants name
its positions.

:data:`HEARTBEAT_PREFIX` is here because both the driver (which emits the
heartbeat) and the executor's assembler (which drops it) need it, and neither
should import the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

#: Prefix of pgpoll's own logical messages (heartbeats); never written as changes.
HEARTBEAT_PREFIX = "pgpoll.heartbeat"


class Op(str, Enum):  # noqa: UP042 -- not StrEnum: that would change str(Op.INSERT) ("Op.INSERT" today)
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
    type_name: str | None = None
    type_oid: int | None = None
    type_modifier: int | None = None
    is_key: bool = False


# ---- the fast row shape ----------------------------------------------------


class _Unchanged:
    """Type of :data:`UNCHANGED_TOAST` (one instance; pickles to the same one)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


#: Marks an unchanged TOAST column (value not sent) in :data:`RowFields` value lists.
UNCHANGED_TOAST = _Unchanged()

#: One value in a :data:`RowFields` list: text, ``None`` (SQL NULL) or :data:`UNCHANGED_TOAST`.
Value = str | None | _Unchanged


class RelationInfo:
    """A table as a decoder describes it to the rows that refer to it.

    ``columns`` in row order (names, types, key flags); ``names`` the column
    names in that order; ``width`` their number; ``key_indexes`` and
    ``key_names`` the positions and names of the replica-identity key
    columns; ``replica_identity`` the
    ``relreplident`` letter (``d``, ``n``, ``f``, ``i``) or ``None``;
    ``relation_id`` the table's OID where the plugin sends it. Rows refer to
    one object per relation definition, so it can key caches by identity.
    """

    __slots__ = ("columns", "key_indexes", "key_names", "names", "relation_id", "replica_identity", "schema", "table", "width")

    def __init__(
        self,
        relation_id: int | None,
        schema: str,
        table: str,
        columns: tuple[Column, ...],
        replica_identity: str | None = None,
    ) -> None:
        self.relation_id = relation_id
        self.schema = schema
        self.table = table
        self.replica_identity = replica_identity
        self.columns = columns
        self.names = tuple(c.name for c in columns)
        self.width = len(columns)
        self.key_indexes = tuple(i for i, c in enumerate(columns) if c.is_key)
        self.key_names = tuple(c.name for c in columns if c.is_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.relation_id}, {self.schema!r}, {self.table!r}, {self.names!r})"


#: An INSERT, UPDATE or DELETE from a decoder's fast path:
#: ``(op, relation, xid, before, before_is_key, after)``. ``before`` and
#: ``after`` are lists (owned by the receiver) of :data:`Value` in
#: ``relation.names`` order, or ``None``. When ``before_is_key`` only the
#: values at ``relation.key_indexes`` are meaningful. ``xid`` is the change's
#: transaction (a subtransaction's inside a stream) where known.
RowFields = tuple[Op, RelationInfo, int | None, list[Value] | None, bool, list[Value] | None]
#: Positions in :data:`RowFields`.
ROW_OP, ROW_RELATION, ROW_XID, ROW_BEFORE, ROW_BEFORE_IS_KEY, ROW_AFTER = range(6)

_NO_NAMES: list[str] = []  # shared, never mutated


def _leave_out_unchanged(names: Sequence[str], values: Sequence[Value]) -> tuple[list[str], list[Value], list[str]]:
    """``(names, values)`` without the unchanged TOAST columns, and the names left out."""
    kept_names: list[str] = []
    kept_values: list[Value] = []
    unchanged: list[str] = []
    for name, value in zip(names, values, strict=True):
        if value is UNCHANGED_TOAST:
            unchanged.append(name)
        else:
            kept_names.append(name)
            kept_values.append(value)
    return kept_names, kept_values, unchanged


def split_row(
    row: RowFields,
) -> tuple[Sequence[str] | None, Sequence[str | None], Sequence[str] | None, Sequence[str | None], list[str]]:
    """``(before_names, before_values, after_names, after_values, unchanged_toast)`` of a fast-path row.

    The rules, written once: a key-only ``before`` keeps the key columns; an
    unchanged TOAST column is left out of ``before`` and ``after`` and named
    in ``unchanged_toast`` (for ``after``); an absent side has names ``None``
    and no values. Values are not copied where nothing is left out, so the
    caller must not mutate what it gets. ``unchanged_toast`` is a shared
    empty list when there are none.
    """
    _op, rel, _xid, before, is_key, after = row
    before_names: Sequence[str] | None = None
    before_values: Sequence[Value] = ()
    if before is not None:
        if is_key:
            before_names, before_values = rel.key_names, [before[i] for i in rel.key_indexes]
        else:
            before_names, before_values = rel.names, before
        if UNCHANGED_TOAST in before_values:
            before_names, before_values, _ = _leave_out_unchanged(before_names, before_values)
    after_names: Sequence[str] | None = None
    after_values: Sequence[Value] = ()
    toast = _NO_NAMES
    if after is not None:
        if UNCHANGED_TOAST in after:
            after_names, after_values, toast = _leave_out_unchanged(rel.names, after)
        else:
            after_names, after_values = rel.names, after
    return before_names, before_values, after_names, after_values, toast  # type: ignore[return-value]


# ---- transaction framing -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction. ``final_lsn`` is the commit record's start (pgoutput)."""

    xid: int | None
    lsn: int | None = None
    final_lsn: int | None = None
    commit_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction. ``end_lsn`` is the commit record's end.

    For the SQL interface the COMMIT row's ``lsn`` equals ``end_lsn``; the
    assembler uses the row ``lsn`` when known, else ``end_lsn``.
    """

    xid: int | None
    lsn: int | None = None
    commit_lsn: int | None = None
    end_lsn: int | None = None
    commit_ts: datetime | None = None


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
    before: Mapping[str, str | None] | None
    after: Mapping[str, str | None] | None
    unchanged_toast: tuple[str, ...] = ()
    before_is_key: bool = False
    xid: int | None = None
    lsn: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """TRUNCATE of one or more tables (one event, as the plugins send it)."""

    relations: tuple[tuple[str, str], ...]
    cascade: bool = False
    restart_identity: bool = False
    xid: int | None = None
    lsn: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` record."""

    transactional: bool
    prefix: str
    content: bytes
    xid: int | None = None
    lsn: int | None = None


# ---- streaming and two-phase framing --------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A chunk of an in-progress transaction begins."""

    xid: int
    first_segment: bool = False
    lsn: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The current streamed chunk ends."""

    lsn: int | None = None


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """A streamed transaction committed: its buffered chunks become committed changes."""

    xid: int
    lsn: int | None = None
    commit_lsn: int | None = None
    end_lsn: int | None = None
    commit_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed (sub)transaction aborted: drop what was buffered for ``subxid``."""

    xid: int
    subxid: int
    lsn: int | None = None
    abort_lsn: int | None = None
    abort_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """Start of a transaction prepared for two-phase commit."""

    xid: int | None
    gid: str | None = None
    lsn: int | None = None
    prepare_lsn: int | None = None
    end_lsn: int | None = None
    prepare_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class Prepare:
    """PREPARE TRANSACTION (also pgoutput's Stream Prepare)."""

    xid: int | None
    gid: str | None
    lsn: int | None = None
    prepare_lsn: int | None = None
    end_lsn: int | None = None
    prepare_ts: datetime | None = None
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """COMMIT PREPARED 'gid'."""

    xid: int | None
    gid: str | None
    lsn: int | None = None
    commit_lsn: int | None = None
    end_lsn: int | None = None
    commit_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """ROLLBACK PREPARED 'gid'."""

    xid: int | None
    gid: str | None
    lsn: int | None = None
    prepare_end_lsn: int | None = None
    rollback_end_lsn: int | None = None
    prepare_ts: datetime | None = None
    rollback_ts: datetime | None = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """A row with no change in it (pgoutput Relation, Type, Origin...)."""

    kind: str
    lsn: int | None = None


Event = (
    Begin | Commit | RowChange | Truncate | LogicalMessage
    | StreamStart | StreamStop | StreamCommit | StreamAbort
    | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared | Ignored
)  # fmt: skip


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

    commit_lsn: int | None
    lsn: int | None
    seq: int
    xid: int | None
    commit_ts: datetime | None
    op: Op
    schema_name: str | None = None
    table_name: str | None = None
    before: Mapping[str, str | None] | None = None
    after: Mapping[str, str | None] | None = None
    unchanged_toast: tuple[str, ...] = field(default=())
    message_prefix: str | None = None
    message_content: bytes | None = None
    transactional: bool | None = None
