"""pgoutput decoder: the rows of one peek in order, :mod:`pgpoll.changes` events out.

:class:`PgoutputDecoder` is the stateful part of decoding pgoutput (the
parsing is :mod:`pgpoll.decode.pgoutput_parser`, the tuple readers
:mod:`pgpoll.decode.pgoutput_tuples`). It caches Relation and Type messages
and tracks the current transaction and stream. pgoutput re-sends Relation
messages in every SQL call (and after DDL), so use **one decoder per
peek/get call**. Pure: no I/O.

Values (``'t'`` text) become ``str`` (UTF-8), ``'n'`` becomes ``None`` and
``'u'`` (unchanged TOAST) leaves the column out of ``after`` and names it in
``unchanged_toast``; a ``'b'`` (binary) value is hex text of the type's send
form (see :mod:`pgpoll.decode.pgoutput_tuples`). Booleans come out as
``true``/``false`` like ``bool::text`` and test_decoding.

Speed: :meth:`PgoutputDecoder.decode_row` is the fast path for Insert,
Update and Delete. It reads the message with precompiled unpackers and one
loop per tuple, builds no dataclass and returns the plain tuple
:data:`pgpoll.changes.RowFields`. On any malformation it re-reads the message
through the bounds-checked :class:`~pgpoll.decode.wire.Reader` path, so the
error raised is the same precise :class:`~pgpoll.errors.DecodeError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgpoll import changes as ch
from pgpoll.changes import UNCHANGED_TOAST, RowFields, Value, split_row
from pgpoll.decode import pgoutput_messages as m
from pgpoll.decode.pgoutput_parser import MAX_PROTO_VERSION, check_proto_version, parse_message
from pgpoll.decode.pgoutput_tuples import BOOL_TEXT, FAST_PATH_ERRORS, MalformedError, PgoutputRelation, read_tuple, tuple_values
from pgpoll.decode.wire import Buffer, unpack_uint32
from pgpoll.errors import ConfigError, DecodeError

__all__ = ["MAX_PROTO_VERSION", "UNCHANGED_TOAST", "PgoutputDecoder", "PgoutputRelation", "RowFields", "parse_message"]

_INSERT, _UPDATE, _DELETE = ch.Op.INSERT, ch.Op.UPDATE, ch.Op.DELETE
_u32 = unpack_uint32
_BOOL_TEXT = BOOL_TEXT  # assigned, not imported: CPython then calls .get without a bound method (LOAD_METHOD)

#: :data:`RowFields` as the decoder builds it (its relation is a :class:`PgoutputRelation`).
_Row = tuple[ch.Op, PgoutputRelation, int | None, list[Value] | None, bool, list[Value] | None]


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

    __slots__ = ("_convert", "_in_stream", "_xid", "proto_version", "relations", "streaming", "types")

    def __init__(self, proto_version: int, streaming: bool = False) -> None:
        check_proto_version(proto_version)
        if streaming and proto_version < 2:
            raise ConfigError("pgoutput streaming needs proto_version 2 or higher")
        self.proto_version = proto_version
        self.streaming = streaming
        #: relation id -> what its latest Relation message said
        self.relations: dict[int, PgoutputRelation] = {}
        #: type OID -> (schema, type name), from Type messages
        self.types: dict[int, tuple[str, str]] = {}
        self._xid: int | None = None
        self._in_stream = False
        self._convert: dict[type, Callable[[Any, int | None], ch.Event]] = {
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

    def decode(self, data: Buffer, lsn: int | None = None) -> ch.Event:
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

    def decode_row(self, data: Buffer) -> RowFields | None:
        """Fast path: Insert, Update, Delete to :data:`RowFields`; ``None`` for any other message.

        Messages for which this returns ``None`` must go through
        :meth:`decode` (they update the relation cache and stream state).
        Booleans come out as ``true``/``false`` (see :class:`PgoutputRelation`).
        """
        row = self._wire_row(data)
        if row is not None and row[1].bool_indexes:
            for values in (row[3], row[5]):
                if values is not None:
                    for i in row[1].bool_indexes:
                        values[i] = _BOOL_TEXT.get(values[i], values[i])  # type: ignore[arg-type]
        return row

    def _wire_row(self, data: Buffer) -> _Row | None:
        """:meth:`decode_row` with every value as sent."""
        if type(data) is not bytes:  # one copy beats slicing a memoryview per column
            data = data.tobytes() if type(data) is memoryview else bytes(data)  # tobytes: 2x faster
        first = data[0] if data else 0
        if first == 73:  # 'I': the hot path, kept free of anything Update/Delete need
            try:
                if self._in_stream:
                    xid: int | None = _u32(data, 1)[0]
                    pos = 5
                else:
                    xid, pos = self._xid, 1
                relid = _u32(data, pos)[0]
                if data[pos + 4] != 78:  # 'N'
                    raise MalformedError
                after, pos = read_tuple(data, pos + 5)
                if pos != len(data):
                    raise MalformedError
            except FAST_PATH_ERRORS:
                return self._row_slow(data, _INSERT)
            rel = self.relations.get(relid)
            if rel is None or len(after) != rel.width:
                rel = self._relation_for(_INSERT, relid, None, after)  # raises
            return (_INSERT, rel, xid, None, False, after)
        if first == 85 or first == 68:  # 'U', 'D'
            return self._decode_update_delete(data, _UPDATE if first == 85 else _DELETE)
        return None

    # ---- rows ------------------------------------------------------------------------

    def _decode_update_delete(self, data: bytes, op: ch.Op) -> _Row:
        try:
            if self._in_stream:
                xid: int | None = _u32(data, 1)[0]
                pos = 5
            else:
                xid, pos = self._xid, 1
            relid = _u32(data, pos)[0]
            kind = data[pos + 4]
            pos += 5
            before: list[Value] | None = None
            after: list[Value] | None = None
            if kind == 75 or kind == 79:  # 'K', 'O'
                before, pos = read_tuple(data, pos)
                if op is _UPDATE:
                    if data[pos] != 78:  # 'N'
                        raise MalformedError
                    after, pos = read_tuple(data, pos + 1)
            elif kind == 78 and op is _UPDATE:
                after, pos = read_tuple(data, pos)
            else:
                raise MalformedError
            if pos != len(data):
                raise MalformedError
        except FAST_PATH_ERRORS:
            return self._row_slow(data, op)
        return (op, self._relation_for(op, relid, before, after), xid, before, kind == 75, after)

    def _relation_for(
        self, op: ch.Op, relid: int, before: list[Value] | None, after: list[Value] | None
    ) -> PgoutputRelation:
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

    def _row_slow(self, data: bytes, op: ch.Op) -> _Row:
        msg = self.parse(data)  # raises the precise DecodeError for malformed input
        assert isinstance(msg, (m.Insert, m.Update, m.Delete))
        name = m.MESSAGE_NAMES[op.value]
        xid = msg.xid if self._in_stream else self._xid
        old = None if isinstance(msg, m.Insert) else msg.old
        new = None if isinstance(msg, m.Delete) else msg.new
        old_kind = None if isinstance(msg, m.Insert) else msg.old_kind
        before, after = tuple_values(old, name), tuple_values(new, name)
        return (op, self._relation_for(op, msg.relation_id, before, after), xid, before, old_kind == "K", after)

    def _row_event(self, row: RowFields, lsn: int | None) -> ch.RowChange:
        op, rel, xid, _before, is_key, _after = row
        before_names, before_values, after_names, after_values, unchanged = split_row(row)
        before = None if before_names is None else dict(zip(before_names, before_values))  # noqa: B905 -- equal lengths
        after = None if after_names is None else dict(zip(after_names, after_values))  # noqa: B905 -- equal lengths
        toast = tuple(unchanged) if unchanged else ()
        return ch.RowChange(op, rel.schema, rel.table, rel.columns, before, after, toast, is_key, xid, lsn)

    # ---- other messages -------------------------------------------------------------

    def _change_xid(self, msg_xid: int | None) -> int | None:
        return msg_xid if self._in_stream else self._xid

    def _on_begin(self, msg: m.Begin, lsn: int | None) -> ch.Begin:
        self._xid = msg.xid
        return ch.Begin(msg.xid, lsn, msg.final_lsn, msg.commit_ts)

    def _on_commit(self, msg: m.Commit, lsn: int | None) -> ch.Commit:
        xid, self._xid = self._xid, None
        return ch.Commit(xid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_ignored(self, msg: m.Origin, lsn: int | None) -> ch.Ignored:
        return ch.Ignored("origin", lsn)

    def _on_relation(self, msg: m.Relation, lsn: int | None) -> ch.Ignored:
        self.relations[msg.relation_id] = PgoutputRelation(msg)
        return ch.Ignored("relation", lsn)

    def _on_type(self, msg: m.Type, lsn: int | None) -> ch.Ignored:
        self.types[msg.type_oid] = (msg.schema, msg.name)
        return ch.Ignored("type", lsn)

    def _on_message(self, msg: m.Message, lsn: int | None) -> ch.LogicalMessage:
        xid = self._change_xid(msg.xid) if msg.transactional else None
        return ch.LogicalMessage(msg.transactional, msg.prefix, msg.content, xid, lsn)

    def _on_truncate(self, msg: m.Truncate, lsn: int | None) -> ch.Truncate:
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

    def _on_stream_start(self, msg: m.StreamStart, lsn: int | None) -> ch.StreamStart:
        self._check_stream("Stream Start", False)
        self._in_stream = True
        return ch.StreamStart(msg.xid, msg.first_segment, lsn)

    def _on_stream_stop(self, msg: m.StreamStop, lsn: int | None) -> ch.StreamStop:
        self._check_stream("Stream Stop", True)
        self._in_stream = False
        return ch.StreamStop(lsn)

    def _on_stream_commit(self, msg: m.StreamCommit, lsn: int | None) -> ch.StreamCommit:
        self._check_stream("Stream Commit", False)
        return ch.StreamCommit(msg.xid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_stream_abort(self, msg: m.StreamAbort, lsn: int | None) -> ch.StreamAbort:
        self._check_stream("Stream Abort", False)
        return ch.StreamAbort(msg.xid, msg.subxid, lsn, msg.abort_lsn, msg.abort_ts)

    def _on_begin_prepare(self, msg: m.BeginPrepare, lsn: int | None) -> ch.BeginPrepare:
        self._xid = msg.xid
        return ch.BeginPrepare(msg.xid, msg.gid, lsn, msg.prepare_lsn, msg.end_lsn, msg.prepare_ts)

    def _on_prepare(self, msg: m.Prepare | m.StreamPrepare, lsn: int | None) -> ch.Prepare:
        streamed = isinstance(msg, m.StreamPrepare)
        if streamed:
            self._check_stream("Stream Prepare", False)
        self._xid = None
        return ch.Prepare(msg.xid, msg.gid, lsn, msg.prepare_lsn, msg.end_lsn, msg.prepare_ts, streamed)

    def _on_commit_prepared(self, msg: m.CommitPrepared, lsn: int | None) -> ch.CommitPrepared:
        return ch.CommitPrepared(msg.xid, msg.gid, lsn, msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_rollback_prepared(self, msg: m.RollbackPrepared, lsn: int | None) -> ch.RollbackPrepared:
        return ch.RollbackPrepared(
            msg.xid, msg.gid, lsn, msg.prepare_end_lsn, msg.rollback_end_lsn, msg.prepare_ts, msg.rollback_ts
        )
