"""pgoutput decoder: one binary output row in, one protocol message or change event out.

Two entry points, both pure (no I/O):

* :func:`parse_message` -- bytes to the protocol dataclass of
  :mod:`pgpoll.decode.pgoutput_messages`, dispatched on the first byte
  through a table; an unknown byte raises ``DecodeError("unsupported message
  type ...")``. It is stateless: the caller says whether the message was sent
  inside a Stream Start / Stream Stop block (``in_stream``), because that is
  when protocol 2+ adds an Int32 xid to Insert, Update, Delete, Truncate,
  Message, Relation and Type.
* :class:`PgoutputDecoder` -- the stateful converter to
  :mod:`pgpoll.changes` events. It caches Relation and Type messages and
  tracks the current transaction and stream. pgoutput re-sends Relation
  messages in every SQL call (and after DDL), so use **one decoder per
  peek/get call**.

Values (``'t'`` text) become ``str`` (UTF-8), ``'n'`` becomes ``None`` and
``'u'`` (unchanged TOAST) leaves the column out of ``after`` and names it in
``unchanged_toast``. A ``'b'`` (binary, option ``binary 'true'``) value is the
type's *binary send form*, not its text: it is given as hex text
``'\\x0a0b...'`` of those bytes. For ``bytea`` that equals PostgreSQL's own text
output (``bytea_output = hex``); for other types it is not the ``::text``
form, and a consumer must decode it by type OID (``RowChange.columns``).

Speed: :meth:`PgoutputDecoder.decode_row` is the fast path for Insert,
Update and Delete. It reads the message with precompiled unpackers and one
loop per tuple, builds no dataclass and returns plain tuples (see
:data:`RowFields`). On any malformation it re-reads the message through the
bounds-checked :class:`~pgpoll.decode.wire.Reader` path, so the error raised
is the same precise :class:`~pgpoll.errors.DecodeError`.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Optional, Union

from pgpoll import changes as ch
from pgpoll.decode import pgoutput_messages as m
from pgpoll.decode.wire import Buffer, Reader, unpack_uint16, unpack_uint32
from pgpoll.errors import ConfigError, DecodeError

__all__ = [
    "UNCHANGED_TOAST",
    "RelationInfo",
    "RowFields",
    "PgoutputDecoder",
    "parse_message",
    "MAX_PROTO_VERSION",
]

MAX_PROTO_VERSION = 4

#: First byte -> (the message class's reader, lowest protocol version that sends it).
_DISPATCH: dict[int, tuple[Callable[[Reader, bool], m.PgoutputMessage], int]] = {
    ord("B"): (m.Begin.read, 1),
    ord("M"): (m.Message.read, 1),
    ord("C"): (m.Commit.read, 1),
    ord("O"): (m.Origin.read, 1),
    ord("R"): (m.Relation.read, 1),
    ord("Y"): (m.Type.read, 1),
    ord("I"): (m.Insert.read, 1),
    ord("U"): (m.Update.read, 1),
    ord("D"): (m.Delete.read, 1),
    ord("T"): (m.Truncate.read, 1),
    ord("S"): (m.StreamStart.read, 2),
    ord("E"): (m.StreamStop.read, 2),
    ord("c"): (m.StreamCommit.read, 2),
    ord("A"): (m.StreamAbort.read, 2),
    ord("b"): (m.BeginPrepare.read, 3),
    ord("P"): (m.Prepare.read, 3),
    ord("K"): (m.CommitPrepared.read, 3),
    ord("r"): (m.RollbackPrepared.read, 3),
    ord("p"): (m.StreamPrepare.read, 3),
}


def parse_message(data: Buffer, proto_version: int, *, in_stream: bool = False) -> m.PgoutputMessage:
    """Parse one pgoutput message into its protocol dataclass.

    ``proto_version`` is the ``proto_version`` option of the peek (1-4);
    ``in_stream`` is True for messages between Stream Start and Stream Stop.
    Raises :class:`DecodeError` for an empty message, an unknown type byte, a
    message the protocol version cannot send, a field past the end, bad
    flags or tuple types, and trailing bytes.
    """
    if not 1 <= proto_version <= MAX_PROTO_VERSION:
        raise ConfigError(f"unsupported pgoutput proto_version {proto_version}", "use 1 to 4")
    if type(data) is not bytes:
        data = bytes(data)  # memoryview from psycopg2 may have format 'c': index as bytes
    if len(data) == 0:
        raise DecodeError("empty pgoutput message", offset=0)
    first = data[0]
    entry = _DISPATCH.get(first)
    if entry is None:
        raise DecodeError(
            f"unsupported message type {chr(first)!r} (0x{first:02x}) in pgoutput output",
            offset=0,
            message_type=chr(first),
        )
    read, since = entry
    name = m.MESSAGE_NAMES[chr(first)]
    if proto_version < since:
        raise DecodeError(
            f"{name} message needs proto_version {since}, decoding {proto_version}", offset=0, message_type=name
        )
    r = Reader(data, 1, name)
    msg = read(r, in_stream)
    r.expect_end()
    return msg


# ---- the stateful decoder -------------------------------------------------------------


class _Unchanged:
    """Type of :data:`UNCHANGED_TOAST`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


#: Marks a ``'u'`` (unchanged TOAST, value not sent) column in :data:`RowFields` value lists.
UNCHANGED_TOAST = _Unchanged()
_BOOL_OID = 16
_BOOL_TEXT = {"t": "true", "f": "false"}

Value = Union[str, None, _Unchanged]


class RelationInfo:
    """What a Relation message told the decoder, prepared for the hot path.

    ``names`` are the column names in wire order; ``key_indexes`` the
    positions of replica-identity key columns (flag bit 1); ``columns`` the
    change-model description of each column; ``message`` the Relation itself.
    """

    __slots__ = (
        "relation_id", "schema", "table", "replica_identity", "columns", "names", "width", "key_indexes",
        "bool_indexes", "message",
    )

    def __init__(self, rel: m.Relation) -> None:
        self.relation_id = rel.relation_id
        self.schema = rel.schema
        self.table = rel.name
        self.replica_identity = rel.replica_identity
        self.columns = tuple(
            ch.Column(c.name, None, c.type_oid, c.type_modifier, c.is_key) for c in rel.columns
        )
        self.names = tuple(c.name for c in rel.columns)
        self.width = len(self.names)
        self.key_indexes = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        # boolout prints t/f, but bool::text (and test_decoding) print true/false
        self.bool_indexes = tuple(i for i, c in enumerate(rel.columns) if c.type_oid == _BOOL_OID)
        self.message = rel

    def __repr__(self) -> str:
        return f"RelationInfo({self.relation_id}, {self.schema!r}, {self.table!r}, {self.names!r})"


#: What :meth:`PgoutputDecoder.decode_row` returns for Insert, Update and Delete:
#: ``(op, relation, xid, before, before_is_key, after)``. ``xid`` is the
#: message's own xid inside a stream (a subtransaction's xid for its changes),
#: else the current Begin's. ``before`` and ``after`` are lists (owned by the
#: caller) of values in ``relation.names`` order, or ``None``.
#: A value is ``str``, ``None`` (SQL NULL) or :data:`UNCHANGED_TOAST`. For a
#: ``'K'`` old tuple (``before_is_key``) only ``relation.key_indexes`` are
#: meaningful; the others are ``None`` as sent. Values are the wire text,
#: except booleans: ``true``/``false`` like ``bool::text`` and test_decoding
#: (boolout's ``t``/``f`` is rewritten).
RowFields = tuple[ch.Op, RelationInfo, Optional[int], Optional[list[Value]], bool, Optional[list[Value]]]

_INSERT, _UPDATE, _DELETE = ch.Op.INSERT, ch.Op.UPDATE, ch.Op.DELETE
_u16 = unpack_uint16
_u32 = unpack_uint32


class _Malformed(Exception):
    """Internal: the fast path saw something it does not handle; re-read slowly."""


_FAST_PATH_ERRORS = (_Malformed, IndexError, struct.error, UnicodeDecodeError)


def _values(data: bytes, pos: int) -> tuple[list[Value], int]:
    """Read one TupleData at ``pos``; return its values and the next offset.

    Bounds are not checked per column: slices past the end are short, so the
    caller's final ``pos == len(data)`` check (offsets only grow) catches them.
    """
    natts = _u16(data, pos)[0]
    pos += 2
    vals: list[Value] = [None] * natts
    for i in range(natts):
        kind = data[pos]
        if kind == 116:  # 't'
            start = pos + 5
            pos = start + _u32(data, pos + 1)[0]
            vals[i] = data[start:pos].decode()
        elif kind == 110:  # 'n'
            pos += 1
        elif kind == 117:  # 'u'
            vals[i] = UNCHANGED_TOAST
            pos += 1
        elif kind == 98:  # 'b'
            start = pos + 5
            pos = start + _u32(data, pos + 1)[0]
            vals[i] = "\\x" + data[start:pos].hex()
        else:
            raise _Malformed
    return vals, pos


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class PgoutputDecoder:
    """Turns the rows of one pgoutput peek into :mod:`pgpoll.changes` events.

    Parameters
    ----------
    proto_version:
        The ``proto_version`` option passed to the peek (1-4).
    streaming:
        True when the peek passed ``streaming`` ``on`` or ``parallel``; stream
        messages are refused otherwise.

    State kept between rows: the Relation and Type caches (``relations``,
    ``types``), the current transaction's xid (from Begin / Begin Prepare, used
    for Commit and for changes, which carry no xid outside streams) and whether
    a Stream Start is open. Create one decoder per SQL call.

    Examples
    --------
    >>> dec = PgoutputDecoder(1)
    >>> for lsn, xid, data in rows:                      # doctest: +SKIP
    ...     row = dec.decode_row(data)                    # fast path, or None
    ...     event = dec.decode(data, lsn) if row is None else row
    """

    __slots__ = ("proto_version", "streaming", "relations", "types", "_xid", "_in_stream", "_convert")

    def __init__(self, proto_version: int, streaming: bool = False) -> None:
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise ConfigError(f"unsupported pgoutput proto_version {proto_version}", "use 1 to 4")
        if streaming and proto_version < 2:
            raise ConfigError("pgoutput streaming needs proto_version 2 or higher")
        self.proto_version = proto_version
        self.streaming = streaming
        #: relation id -> what its latest Relation message said
        self.relations: dict[int, RelationInfo] = {}
        #: type OID -> (schema, type name), from Type messages
        self.types: dict[int, tuple[str, str]] = {}
        self._xid: Optional[int] = None
        self._in_stream = False
        self._convert: dict[type, Callable[[Any, Optional[int]], ch.Event]] = {
            m.Begin: self._on_begin,
            m.Commit: self._on_commit,
            m.Origin: self._on_ignored,
            m.Relation: self._on_relation,
            m.Type: self._on_type,
            m.Message: self._on_message,
            m.Truncate: self._on_truncate,
            m.StreamStart: self._on_stream_start,
            m.StreamStop: self._on_stream_stop,
            m.StreamCommit: self._on_stream_commit,
            m.StreamAbort: self._on_stream_abort,
            m.BeginPrepare: self._on_begin_prepare,
            m.Prepare: self._on_prepare,
            m.StreamPrepare: self._on_prepare,
            m.CommitPrepared: self._on_commit_prepared,
            m.RollbackPrepared: self._on_rollback_prepared,
        }

    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._in_stream

    # ---- public API --------------------------------------------------------------

    def parse(self, data: Buffer) -> m.PgoutputMessage:
        """:func:`parse_message` with this decoder's protocol version and stream state (no state change)."""
        return parse_message(data, self.proto_version, in_stream=self._in_stream)

    def decode(self, data: Buffer, lsn: Optional[int] = None) -> ch.Event:
        """Decode one output row (its ``data`` and ``lsn`` columns) into an event."""
        try:
            row = self.decode_row(data)
            if row is not None:
                return self._row_event(row, lsn)
            msg = self.parse(data)
            return self._convert[type(msg)](msg, lsn)
        except DecodeError as exc:
            if exc.lsn is None and lsn is not None:
                exc.lsn = _lsn_text(lsn)
            raise

    def decode_row(self, data: Buffer) -> Optional[RowFields]:
        """Fast path: Insert, Update, Delete to :data:`RowFields`; ``None`` for any other message.

        Messages for which this returns ``None`` must go through
        :meth:`decode` (they update the relation cache and stream state).
        Booleans come out as ``true``/``false`` (see :class:`RelationInfo`).
        """
        row = self._wire_row(data)
        if row is not None and row[1].bool_indexes:
            for values in (row[3], row[5]):
                if values is not None:
                    for i in row[1].bool_indexes:
                        values[i] = _BOOL_TEXT.get(values[i], values[i])  # type: ignore[arg-type]
        return row

    def _wire_row(self, data: Buffer) -> Optional[RowFields]:
        """:meth:`decode_row` with every value as sent."""
        if type(data) is not bytes:  # one copy beats slicing a memoryview per column
            data = data.tobytes() if type(data) is memoryview else bytes(data)  # tobytes: 2x faster
        first = data[0] if data else 0
        if first == 73:  # 'I': the hot path, kept free of anything Update/Delete need
            try:
                if self._in_stream:
                    xid: Optional[int] = _u32(data, 1)[0]
                    pos = 5
                else:
                    xid, pos = self._xid, 1
                relid = _u32(data, pos)[0]
                if data[pos + 4] != 78:  # 'N'
                    raise _Malformed
                after, pos = _values(data, pos + 5)
                if pos != len(data):
                    raise _Malformed
            except _FAST_PATH_ERRORS:
                return self._row_slow(data, _INSERT)
            rel = self.relations.get(relid)
            if rel is None or len(after) != rel.width:
                rel = self._relation_for(_INSERT, relid, None, after)  # raises
            return (_INSERT, rel, xid, None, False, after)
        if first == 85 or first == 68:  # 'U', 'D'
            return self._decode_update_delete(data, _UPDATE if first == 85 else _DELETE)
        return None

    # ---- rows ------------------------------------------------------------------------

    def _decode_update_delete(self, data: bytes, op: ch.Op) -> RowFields:
        try:
            if self._in_stream:
                xid: Optional[int] = _u32(data, 1)[0]
                pos = 5
            else:
                xid, pos = self._xid, 1
            relid = _u32(data, pos)[0]
            kind = data[pos + 4]
            pos += 5
            before: Optional[list[Value]] = None
            after: Optional[list[Value]] = None
            if kind == 75 or kind == 79:  # 'K', 'O'
                before, pos = _values(data, pos)
                if op is _UPDATE:
                    if data[pos] != 78:  # 'N'
                        raise _Malformed
                    after, pos = _values(data, pos + 1)
            elif kind == 78 and op is _UPDATE:
                after, pos = _values(data, pos)
            else:
                raise _Malformed
            if pos != len(data):
                raise _Malformed
        except _FAST_PATH_ERRORS:
            return self._row_slow(data, op)
        return (op, self._relation_for(op, relid, before, after), xid, before, kind == 75, after)

    def _relation_for(
        self, op: ch.Op, relid: int, before: Optional[list[Value]], after: Optional[list[Value]]
    ) -> RelationInfo:
        """The cached relation, checked to be known and as wide as both tuples; else raise."""
        name = m.MESSAGE_NAMES[op.value]
        rel = self.relations.get(relid)
        if rel is None:
            raise DecodeError(
                f"{name} for relation {relid} before its Relation message",
                "decode every row of the peek with one decoder, in order",
                relation=str(relid),
                message_type=name,
            )
        for values in (before, after):
            if values is not None and len(values) != rel.width:
                raise DecodeError(
                    f"{name} tuple has {len(values)} columns, relation {rel.schema}.{rel.table} has {rel.width}",
                    relation=f"{rel.schema}.{rel.table}",
                    message_type=name,
                )
        return rel

    def _row_slow(self, data: bytes, op: ch.Op) -> RowFields:
        msg = self.parse(data)  # raises the precise DecodeError for malformed input
        assert isinstance(msg, (m.Insert, m.Update, m.Delete))
        name = m.MESSAGE_NAMES[op.value]
        xid = msg.xid if self._in_stream else self._xid
        old = None if isinstance(msg, m.Insert) else msg.old
        new = None if isinstance(msg, m.Delete) else msg.new
        old_kind = None if isinstance(msg, m.Insert) else msg.old_kind
        before, after = _text_values(old, name), _text_values(new, name)
        return (op, self._relation_for(op, msg.relation_id, before, after), xid, before, old_kind == "K", after)

    def _row_event(self, row: RowFields, lsn: Optional[int]) -> ch.RowChange:
        op, rel, xid, before, is_key, after = row
        names = rel.names
        unchanged: tuple[str, ...] = ()
        after_map: Optional[dict[str, Optional[str]]] = None
        if after is not None:
            if UNCHANGED_TOAST in after:
                unchanged = tuple(n for n, v in zip(names, after) if v is UNCHANGED_TOAST)
                after_map = {n: v for n, v in zip(names, after) if not isinstance(v, _Unchanged)}
            else:
                after_map = dict(zip(names, after))  # type: ignore[arg-type]
        before_map: Optional[dict[str, Optional[str]]] = None
        if before is not None:
            pairs = ((names[i], before[i]) for i in rel.key_indexes) if is_key else zip(names, before)
            before_map = {n: v for n, v in pairs if not isinstance(v, _Unchanged)}
        return ch.RowChange(op, rel.schema, rel.table, rel.columns, before_map, after_map, unchanged, is_key, xid, lsn)

    # ---- other messages -------------------------------------------------------------

    def _change_xid(self, msg_xid: Optional[int]) -> Optional[int]:
        return msg_xid if self._in_stream else self._xid

    def _on_begin(self, msg: m.Begin, lsn: Optional[int]) -> ch.Begin:
        self._xid = msg.xid
        return ch.Begin(msg.xid, lsn, msg.final_lsn, msg.commit_ts)

    def _on_commit(self, msg: m.Commit, lsn: Optional[int]) -> ch.Commit:
        xid, self._xid = self._xid, None
        return ch.Commit(xid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_ignored(self, msg: m.Origin, lsn: Optional[int]) -> ch.Ignored:
        return ch.Ignored("origin", lsn)

    def _on_relation(self, msg: m.Relation, lsn: Optional[int]) -> ch.Ignored:
        self.relations[msg.relation_id] = RelationInfo(msg)
        return ch.Ignored("relation", lsn)

    def _on_type(self, msg: m.Type, lsn: Optional[int]) -> ch.Ignored:
        self.types[msg.type_oid] = (msg.schema, msg.name)
        return ch.Ignored("type", lsn)

    def _on_message(self, msg: m.Message, lsn: Optional[int]) -> ch.LogicalMessage:
        xid = self._change_xid(msg.xid) if msg.transactional else None
        return ch.LogicalMessage(msg.transactional, msg.prefix, msg.content, xid, lsn)

    def _on_truncate(self, msg: m.Truncate, lsn: Optional[int]) -> ch.Truncate:
        rels = []
        for relid in msg.relation_ids:
            rel = self.relations.get(relid)
            if rel is None:
                raise DecodeError(
                    f"Truncate of relation {relid} before its Relation message", relation=str(relid), message_type="Truncate"
                )
            rels.append((rel.schema, rel.table))
        return ch.Truncate(tuple(rels), msg.cascade, msg.restart_identity, self._change_xid(msg.xid), lsn)

    def _check_stream(self, name: str, inside: bool) -> None:
        if not self.streaming:
            raise DecodeError(
                f"{name} message, but the decoder was created with streaming=False",
                "create PgoutputDecoder(proto_version, streaming=True) for peeks with streaming on",
                message_type=name,
            )
        if self._in_stream != inside:
            where = "inside" if self._in_stream else "outside"
            raise DecodeError(f"{name} message {where} a stream block", message_type=name)

    def _on_stream_start(self, msg: m.StreamStart, lsn: Optional[int]) -> ch.StreamStart:
        self._check_stream("Stream Start", False)
        self._in_stream = True
        return ch.StreamStart(msg.xid, msg.first_segment, lsn)

    def _on_stream_stop(self, msg: m.StreamStop, lsn: Optional[int]) -> ch.StreamStop:
        self._check_stream("Stream Stop", True)
        self._in_stream = False
        return ch.StreamStop(lsn)

    def _on_stream_commit(self, msg: m.StreamCommit, lsn: Optional[int]) -> ch.StreamCommit:
        self._check_stream("Stream Commit", False)
        return ch.StreamCommit(msg.xid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_stream_abort(self, msg: m.StreamAbort, lsn: Optional[int]) -> ch.StreamAbort:
        self._check_stream("Stream Abort", False)
        return ch.StreamAbort(msg.xid, msg.subxid, lsn, msg.abort_lsn, msg.abort_ts)

    def _on_begin_prepare(self, msg: m.BeginPrepare, lsn: Optional[int]) -> ch.BeginPrepare:
        self._xid = msg.xid
        return ch.BeginPrepare(msg.xid, msg.gid, lsn, msg.prepare_lsn, msg.end_lsn, msg.prepare_ts)

    def _on_prepare(self, msg: Union[m.Prepare, m.StreamPrepare], lsn: Optional[int]) -> ch.Prepare:
        streamed = isinstance(msg, m.StreamPrepare)
        if streamed:
            self._check_stream("Stream Prepare", False)
        self._xid = None
        return ch.Prepare(msg.xid, msg.gid, lsn, msg.prepare_lsn, msg.end_lsn, msg.prepare_ts, streamed)

    def _on_commit_prepared(self, msg: m.CommitPrepared, lsn: Optional[int]) -> ch.CommitPrepared:
        return ch.CommitPrepared(msg.xid, msg.gid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_rollback_prepared(self, msg: m.RollbackPrepared, lsn: Optional[int]) -> ch.RollbackPrepared:
        return ch.RollbackPrepared(
            msg.xid, msg.gid, lsn, msg.prepare_end_lsn, msg.rollback_end_lsn, msg.prepare_ts, msg.rollback_ts
        )


def _text_values(tup: Optional[m.TupleData], name: str) -> Optional[list[Value]]:
    """TupleData to RowFields values (the slow path's twin of :func:`_values`)."""
    if tup is None:
        return None
    out: list[Value] = []
    for i, (kind, raw) in enumerate(zip(tup.kinds, tup.values)):
        if kind == "u":
            out.append(UNCHANGED_TOAST)
        elif raw is None:
            out.append(None)
        elif kind == "b":
            out.append("\\x" + raw.hex())
        else:
            try:
                out.append(raw.decode())
            except UnicodeDecodeError:
                raise DecodeError(f"{name} column {i + 1} is not valid UTF-8", message_type=name) from None
    return out
