"""One frozen dataclass per pgoutput protocol message (protocol versions 1-4): relations, types and rows here.

Each class is named after the message in PostgreSQL's "Logical Replication
Message Formats". Its docstring lists the fields in wire order, after the
``Byte1`` type byte (which is not stored), and its ``read`` classmethod reads
them in that order -- so layout, reader and
``src/backend/replication/logical/proto.c`` can be checked side by side.

Conventions: xids, OIDs and LSNs are unsigned; ``TimestampTz`` (Int64 µs
since 2000-01-01 UTC) becomes an aware ``datetime`` in UTC; an xid "only
present for streamed transactions" (protocol 2+) is read when the message
came between Stream Start and Stream Stop (``in_stream``) and is ``None``
otherwise; strings are UTF-8; column values stay raw bytes in
:class:`TupleData`. ``Int8(0)`` flags must be 0, as proto.c requires.

The messages that frame transactions (Begin, Commit, Origin, the Stream and
two-phase ones) are in :mod:`pgpoll.decode.pgoutput_transactions`; they are
importable from here too, with :data:`PgoutputMessage`, the union of all.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgpoll.decode.pgoutput_transactions import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Origin,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
)
from pgpoll.decode.wire import Reader

__all__ = [
    "MESSAGE_NAMES", "Begin", "BeginPrepare", "Commit", "CommitPrepared", "Delete", "Insert", "Message", "Origin",
    "PgoutputMessage", "Prepare", "Relation", "RelationColumn", "RollbackPrepared", "StreamAbort", "StreamCommit",
    "StreamPrepare", "StreamStart", "StreamStop", "Truncate", "TupleData", "Type", "Update",
]

#: Message type byte -> message name, as the documentation names them.
MESSAGE_NAMES: dict[str, str] = {
    "B": "Begin", "M": "Message", "C": "Commit", "O": "Origin", "R": "Relation",
    "Y": "Type", "I": "Insert", "U": "Update", "D": "Delete", "T": "Truncate",
    "S": "Stream Start", "E": "Stream Stop", "c": "Stream Commit", "A": "Stream Abort",
    "b": "Begin Prepare", "P": "Prepare", "K": "Commit Prepared",
    "r": "Rollback Prepared", "p": "Stream Prepare",
}  # fmt: skip


def _xid(r: Reader, in_stream: bool) -> int | None:
    return r.read_uint32("Int32 xid") if in_stream else None


def _action(r: Reader, allowed: str) -> str:
    pos = r.pos
    action = r.read_byte1("Byte1 tuple type")
    if action not in allowed:
        raise r.error(f"expected tuple type {' or '.join(allowed)}, got {action!r}", pos)
    return action


@dataclass(frozen=True, slots=True)
class TupleData:
    """TupleData: the values of one row::

        Int16       number of columns; then per published column one of:
        Byte1('n')  NULL
        Byte1('u')  unchanged TOASTed value (the value is not sent)
        Byte1('t')  text value: Int32 length, Byte(n) the type's text output
        Byte1('b')  binary value (PG 14+, option binary): Int32 length,
                    Byte(n) the type's binary send form

    ``kinds[i]`` is ``'n'``, ``'u'``, ``'t'`` or ``'b'``; ``values[i]`` the raw
    bytes for ``'t'``/``'b'``, ``None`` for ``'n'``/``'u'``.
    """

    kinds: tuple[str, ...]
    values: tuple[bytes | None, ...]

    @classmethod
    def read(cls, r: Reader) -> TupleData:
        kinds: list[str] = []
        values: list[bytes | None] = []
        for _ in range(r.read_uint16("Int16 number of columns")):
            pos = r.pos
            kind = r.read_byte1("TupleData column kind")
            if kind == "t" or kind == "b":
                values.append(r.read_bytes(r.read_uint32("Int32 value length"), "column value"))
            elif kind == "n" or kind == "u":
                values.append(None)
            else:
                raise r.error(f"unknown TupleData column kind {kind!r}", pos)
            kinds.append(kind)
        return cls(tuple(kinds), tuple(values))


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column part of a Relation message::

        Int8         flags: 0, or 1 when the column is part of the key
        String       column name
        Int32 (Oid)  data type OID
        Int32        type modifier (atttypmod; signed, -1 for none)
    """

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        """Flag bit 1: part of the replica identity key."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Message:
    """Message ``'M'`` (``pg_logical_emit_message``)::

        Int32 (TransactionId)  xid (only in streamed transactions; protocol 2+)
        Int8                   flags: 0, or 1 if transactional
        Int64 (XLogRecPtr)     LSN of the message
        String                 prefix
        Int32                  length of the content
        Byte(n)                content
    """

    xid: int | None
    flags: int
    lsn: int
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        """Flag bit 1."""
        return bool(self.flags & 1)

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Message:
        xid, flags, lsn, prefix = _xid(r, in_stream), r.read_uint8("flags"), r.read_uint64("LSN"), r.read_string("prefix")
        return cls(xid, flags, lsn, prefix, r.read_bytes(r.read_uint32("content length"), "content"))


@dataclass(frozen=True, slots=True)
class Relation:
    """Relation ``'R'``::

        Int32 (TransactionId)  xid (only in streamed transactions; protocol 2+)
        Int32 (Oid)            relation OID
        String                 namespace ('' for pg_catalog)
        String                 relation name
        Int8                   replica identity (relreplident: d, n, f, i)
        Int16                  number of columns; then a RelationColumn each
    """

    xid: int | None
    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]

    @property
    def schema(self) -> str:
        """``namespace`` with ``''`` read as ``pg_catalog``, as PostgreSQL documents."""
        return self.namespace or "pg_catalog"

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Relation:
        xid, relid = _xid(r, in_stream), r.read_uint32("relation OID")
        namespace, name, ident = r.read_string("namespace"), r.read_string("relation name"), r.read_byte1()
        cols = [
            RelationColumn(
                r.read_uint8("column flags"), r.read_string("column name"), r.read_uint32("type OID"), r.read_int32("typmod")
            )
            for _ in range(r.read_uint16("Int16 number of columns"))
        ]
        return cls(xid, relid, namespace, name, ident, tuple(cols))


@dataclass(frozen=True, slots=True)
class Type:
    """Type ``'Y'`` (before a relation using a non-built-in type)::

        Int32 (TransactionId)  xid (only in streamed transactions; protocol 2+)
        Int32 (Oid)            type OID
        String                 namespace ('' for pg_catalog)
        String                 type name
    """

    xid: int | None
    type_oid: int
    namespace: str
    name: str

    @property
    def schema(self) -> str:
        """``namespace`` with ``''`` read as ``pg_catalog``."""
        return self.namespace or "pg_catalog"

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Type:
        xid, oid = _xid(r, in_stream), r.read_uint32("type OID")
        return cls(xid, oid, r.read_string("namespace"), r.read_string("type name"))


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert ``'I'``: [Int32 xid, streamed only], Int32 relation OID, Byte1('N'), TupleData new tuple."""

    xid: int | None
    relation_id: int
    new: TupleData

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Insert:
        xid, relid = _xid(r, in_stream), r.read_uint32("relation OID")
        _action(r, "N")
        return cls(xid, relid, TupleData.read(r))


@dataclass(frozen=True, slots=True)
class Update:
    """Update ``'U'``::

        Int32 (TransactionId)  xid (only in streamed transactions; protocol 2+)
        Int32 (Oid)            relation OID
        Byte1('K')             optional: old key follows (replica identity
                               index; other columns sent as NULL)
        Byte1('O')             optional, instead of 'K': whole old tuple
                               follows (REPLICA IDENTITY FULL)
        TupleData              old key / tuple, when 'K' or 'O' was sent
        Byte1('N')             new tuple follows
        TupleData              new tuple
    """

    xid: int | None
    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Update:
        xid, relid = _xid(r, in_stream), r.read_uint32("relation OID")
        action = _action(r, "KON")
        if action == "N":
            return cls(xid, relid, None, None, TupleData.read(r))
        old = TupleData.read(r)
        _action(r, "N")
        return cls(xid, relid, action, old, TupleData.read(r))


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``'D'``: [Int32 xid, streamed only], Int32 relation OID, Byte1('K' key / 'O' old tuple), TupleData."""

    xid: int | None
    relation_id: int
    old_kind: str
    old: TupleData

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Delete:
        xid, relid = _xid(r, in_stream), r.read_uint32("relation OID")
        return cls(xid, relid, _action(r, "KO"), TupleData.read(r))


@dataclass(frozen=True, slots=True)
class Truncate:
    """Truncate ``'T'``::

        Int32 (TransactionId)  xid (only in streamed transactions; protocol 2+)
        Int32                  number of relations
        Int8                   option bits: 1 CASCADE, 2 RESTART IDENTITY
        Int32 (Oid)            relation OID, once per relation
    """

    xid: int | None
    flags: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        """Option bit 1: CASCADE."""
        return bool(self.flags & 1)

    @property
    def restart_identity(self) -> bool:
        """Option bit 2: RESTART IDENTITY."""
        return bool(self.flags & 2)

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Truncate:
        xid, nrels, flags = _xid(r, in_stream), r.read_uint32("number of relations"), r.read_uint8("option bits")
        if nrels * 4 > r.remaining:
            raise r.error(f"{nrels} relation OIDs need {nrels * 4} bytes, {r.remaining} left")
        return cls(xid, flags, tuple(r.read_uint32("relation OID") for _ in range(nrels)))


PgoutputMessage = (
    Begin | Message | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
    | StreamStart | StreamStop | StreamCommit | StreamAbort
    | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare
)  # fmt: skip
