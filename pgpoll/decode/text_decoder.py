"""Decoder for the text lines of PostgreSQL's ``test_decoding`` output plugin.

One line (the ``data`` column of ``pg_logical_slot_peek_changes``) in, one
:mod:`pgpoll.changes` event out. Formats follow
``contrib/test_decoding/test_decoding.c`` of PostgreSQL 15 to 18 (they are the
same in all four); ``[...]`` marks what an option adds::

    BEGIN[ xid]                                  -> Begin
    COMMIT[ xid][ (at ts)]                       -> Commit
    table s.t: INSERT: cols | (no-tuple-data)    -> RowChange(op=I)
    table s.t: UPDATE:[ old-key: cols new-tuple:] cols | (no-tuple-data)
    table s.t: DELETE: cols | (no-tuple-data)    -> RowChange(op=D)
    table s.a, s.b: TRUNCATE: (no-flags) | restart_seqs | cascade | restart_seqs cascade
    message: transactional: 0|1 prefix: P, sz: N content:<N bytes>
    PREPARE TRANSACTION 'gid'[, txid xid][ (at ts)]
    COMMIT PREPARED 'gid'[, txid xid][ (at ts)]
    ROLLBACK PREPARED 'gid'[, txid xid][ (at ts)]
    opening a streamed block for transaction[ TXN xid]   -> StreamStart
    closing a streamed block for transaction[ TXN xid]   -> StreamStop
    aborting streamed (sub)transaction[ TXN xid]         -> StreamAbort
    committing streamed transaction[ TXN xid][ (at ts)]  -> StreamCommit
    preparing streamed transaction[ TXN] 'gid'[, txid xid][ (at ts)] -> Prepare(streamed)
    streaming change for TXN xid | streaming change for transaction
    streaming truncate for TXN xid | streaming truncate for transaction
    streaming message: transactional: 1 prefix: P, sz: N
    streaming message: transactional: 0 prefix: P, sz: N content:<N bytes>

Limits of the plugin's text, and what this decoder does about them:

* Streamed changes, truncates and transactional messages print no data at
  all. They decode to :class:`~pgpoll.changes.Ignored` with a kind from
  :data:`OPAQUE_STREAM_KINDS`; the assembler refuses to commit a streamed
  transaction holding them (the rows are not in the output). Do not use
  ``stream-changes`` with pgpoll's test_decoding mode.
* Without ``include-xids`` the framing lines carry no xid; the ``xid``
  argument (the peek's ``xid`` column) is used, and for the stream events,
  whose ``xid`` field is not optional, ``0`` (InvalidTransactionId) when
  neither is known.
* ``aborting streamed (sub)transaction TXN n`` does not say whether ``n`` is
  the top transaction or a subtransaction: it decodes to
  ``StreamAbort(xid=n, subxid=n)`` and the assembler drops the stream when
  ``n`` is a streamed top-level xid.
* A message line is ambiguous when its prefix contains ``, sz: N content:``
  with ``N`` equal to the byte length of the rest: the leftmost ``, sz:``
  whose size fits the remaining bytes is taken (so a content that embeds a
  message line is read right).
* ``old-key:`` may hold the key columns or the whole old row (REPLICA
  IDENTITY FULL); the text does not say which, so ``before_is_key`` is False.
"""

from __future__ import annotations

import re
from datetime import datetime

from pgpoll.changes import (
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Event,
    Ignored,
    LogicalMessage,
    Op,
    Prepare,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from pgpoll.decode.text_values import TupleParser, Values, fail, parse_timestamp, scan_gid, scan_qualified_name
from pgpoll.errors import DecodeError
from pgpoll.lsn import Lsn

__all__ = [
    "OPAQUE_STREAM_KINDS",
    "STREAM_CHANGE",
    "STREAM_MESSAGE",
    "STREAM_TRUNCATE",
    "TestDecodingDecoder",
]

#: ``Ignored.kind`` of ``streaming change for ...`` (a change whose data is not printed).
STREAM_CHANGE = "test_decoding:streaming change"
#: ``Ignored.kind`` of ``streaming truncate for ...``.
STREAM_TRUNCATE = "test_decoding:streaming truncate"
#: ``Ignored.kind`` of ``streaming message: transactional: 1 ...`` (content not printed).
STREAM_MESSAGE = "test_decoding:streaming message"
#: Kinds standing for streamed data that test_decoding does not print.
OPAQUE_STREAM_KINDS = frozenset({STREAM_CHANGE, STREAM_TRUNCATE, STREAM_MESSAGE})

_MAX_XID = 0xFFFFFFFF
_AT = r"(?: \(at (.+)\))?\Z"
_BEGIN_RE = re.compile(r"BEGIN(?: ([0-9]+))?\Z")
_COMMIT_RE = re.compile(r"COMMIT(?: ([0-9]+))?" + _AT, re.S)
_GID_TAIL_RE = re.compile(r"(?:, txid ([0-9]+))?" + _AT, re.S)
_STREAM_RES = {
    "opening a streamed block for transaction": re.compile(
        r"opening a streamed block for transaction(?: TXN ([0-9]+))?\Z"
    ),
    "closing a streamed block for transaction": re.compile(
        r"closing a streamed block for transaction(?: TXN ([0-9]+))?\Z"
    ),
    "aborting streamed (sub)transaction": re.compile(
        r"aborting streamed \(sub\)transaction(?: TXN ([0-9]+))?\Z"
    ),
    "streaming change for ": re.compile(r"streaming change for (?:TXN ([0-9]+)|transaction)\Z"),
    "streaming truncate for ": re.compile(
        r"streaming truncate for (?:TXN ([0-9]+)|transaction)\Z"
    ),
}
_STREAM_COMMIT_RE = re.compile(r"committing streamed transaction(?: TXN ([0-9]+))?" + _AT, re.S)
_SZ_RE = re.compile(r", sz: ([0-9]+) content:")
_STREAM_SZ_RE = re.compile(r", sz: ([0-9]+)\Z")
_TRUNCATE_FLAGS = {
    " (no-flags)": (False, False),
    " restart_seqs": (True, False),
    " cascade": (False, True),
    " restart_seqs cascade": (True, True),
}
_NO_TUPLE = " (no-tuple-data)"
_MESSAGE_HEAD = "message: transactional: "
_STREAM_MESSAGE_HEAD = "streaming message: transactional: "


def _xid(text: str | None, fallback: int | None, offset: int) -> int | None:
    if text is None:
        return fallback
    value = int(text)
    if value > _MAX_XID:
        raise fail(f"xid {text} is out of range", offset)
    return value


def _lsn_text(lsn: object) -> str | None:
    if isinstance(lsn, int) and 0 <= lsn < 1 << 64:
        return str(Lsn(lsn))
    return None


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogateescape"))


class TestDecodingDecoder:
    """Turns test_decoding output lines into :mod:`pgpoll.changes` events.

    Holds only caches (column objects, relation names, per-relation regexes,
    all bounded); one instance can decode any number of lines from any slot.

    >>> TestDecodingDecoder().decode("BEGIN 726", lsn=0x16B1970)
    Begin(xid=726, lsn=23796080, final_lsn=None, commit_ts=None)
    """

    __test__ = False  # not a pytest test class, despite the name
    __slots__ = ("_relations", "_tuples")

    def __init__(self) -> None:
        self._tuples = TupleParser()
        # "table s.t: " -> (schema, table), for names without ": " inside quotes
        self._relations: dict[str, tuple[str, str]] = {}

    def decode(self, line: str, lsn: int | None = None, xid: int | None = None) -> Event:
        """Decode one output line.

        Parameters
        ----------
        line:
            The ``data`` column of one row.
        lsn, xid:
            The row's ``lsn`` and ``xid`` columns, where known. ``xid`` is used
            where the line carries none (``include-xids`` off, row changes).

        Raises
        ------
        DecodeError
            For any line that is not test_decoding output; ``offset`` is the
            character offset where parsing failed.
        """
        try:
            if type(line) is not str:
                raise DecodeError(f"test_decoding: expected a str line, got {type(line).__name__}")
            if line.startswith("table "):
                return self._table(line, lsn, xid)
            return self._framing(line, lsn, xid)
        except DecodeError as err:
            if lsn is not None and err.lsn is None:
                err.lsn = _lsn_text(lsn)
            raise
        except Exception as exc:  # a bug or a hostile input must not escape as anything else
            raise DecodeError(
                f"test_decoding: cannot decode line ({type(exc).__name__}: {exc})",
                offset=None,
                lsn=_lsn_text(lsn),
            ) from exc

    def insert_layout(self, prefix: str) -> tuple[list[tuple[str, str]], tuple[str, ...]] | None:
        """The column layout of the last INSERT line that started with ``prefix`` (``table s.t: INSERT:``).

        Each column's ``(name, type)`` as printed and its decoded name; ``None``
        when no such line was decoded (see :mod:`pgpoll.decode.text_columns`).
        """
        return self._tuples.layout(prefix)

    # ---- dispatch --------------------------------------------------------------

    def _framing(self, line: str, lsn: int | None, xid: int | None) -> Event:
        if line.startswith("BEGIN"):
            m = _BEGIN_RE.match(line)
            if m is None:
                raise fail("bad BEGIN line", 5, "BEGIN")
            return Begin(xid=_xid(m.group(1), xid, 6), lsn=lsn)
        if line.startswith("COMMIT PREPARED "):
            gid, xid2, ts = self._gid_line(line, 16, xid, "COMMIT PREPARED")
            return CommitPrepared(xid=xid2, gid=gid, lsn=lsn, end_lsn=lsn, commit_ts=ts)
        if line.startswith("COMMIT"):
            m = _COMMIT_RE.match(line)
            if m is None:
                raise fail("bad COMMIT line", 6, "COMMIT")
            ts = parse_timestamp(m.group(2), m.start(2)) if m.group(2) is not None else None
            return Commit(xid=_xid(m.group(1), xid, 7), lsn=lsn, end_lsn=lsn, commit_ts=ts)
        if line.startswith(_MESSAGE_HEAD):
            return self._message(line, len(_MESSAGE_HEAD), lsn, xid)
        if line.startswith("PREPARE TRANSACTION "):
            gid, xid2, ts = self._gid_line(line, 20, xid, "PREPARE")
            return Prepare(xid=xid2, gid=gid, lsn=lsn, end_lsn=lsn, prepare_ts=ts)
        if line.startswith("ROLLBACK PREPARED "):
            gid, xid2, ts = self._gid_line(line, 18, xid, "ROLLBACK PREPARED")
            return RollbackPrepared(
                xid=xid2, gid=gid, lsn=lsn, rollback_end_lsn=lsn, rollback_ts=ts
            )
        return self._streaming(line, lsn, xid)

    # ---- row changes and truncate ---------------------------------------------

    def _table(self, line: str, lsn: int | None, xid: int | None) -> Event:
        # Fast path: the text up to the first ": " names a relation seen before.
        k = line.find(": ", 6)
        if k > 0:
            known = self._relations.get(line[: k + 2])
            if known is not None:
                action = line[k + 2 : k + 9]
                if action == "INSERT:":
                    return self._insert(line, k + 9, known[0], known[1], lsn, xid)
                if action == "UPDATE:":
                    return self._update(line, k + 9, known[0], known[1], lsn, xid)
                if action == "DELETE:":
                    return self._delete(line, k + 9, known[0], known[1], lsn, xid)
        schema, table, pos = scan_qualified_name(line, 6)
        if line.startswith(": ", pos):
            if pos == k:
                if len(self._relations) >= 4096:
                    self._relations.clear()
                self._relations[line[: k + 2]] = (schema, table)
            action = line[pos + 2 : pos + 9]
            if action == "INSERT:":
                return self._insert(line, pos + 9, schema, table, lsn, xid)
            if action == "UPDATE:":
                return self._update(line, pos + 9, schema, table, lsn, xid)
            if action == "DELETE:":
                return self._delete(line, pos + 9, schema, table, lsn, xid)
        relations = [(schema, table)]
        while line.startswith(", ", pos):
            schema, table, pos = scan_qualified_name(line, pos + 2)
            relations.append((schema, table))
        if not line.startswith(": TRUNCATE:", pos):
            raise fail("expected ': INSERT:', ': UPDATE:', ': DELETE:' or ': TRUNCATE:'", pos)
        flags = _TRUNCATE_FLAGS.get(line[pos + 11 :])
        if flags is None:
            raise fail("bad TRUNCATE flags", pos + 11, "TRUNCATE")
        return Truncate(
            relations=tuple(relations),
            restart_identity=flags[0],
            cascade=flags[1],
            xid=xid,
            lsn=lsn,
        )

    def _insert(
        self, line: str, pos: int, schema: str, table: str, lsn: int | None, xid: int | None
    ) -> RowChange:
        if pos + 16 == len(line) and line.endswith(_NO_TUPLE):
            return RowChange(Op.INSERT, schema, table, (), None, None, xid=xid, lsn=lsn)
        columns, after, toast = self._tuples.parse_cached(line, pos, line[:pos])
        return RowChange(Op.INSERT, schema, table, columns, None, after, toast, xid=xid, lsn=lsn)

    def _update(
        self, line: str, pos: int, schema: str, table: str, lsn: int | None, xid: int | None
    ) -> RowChange:
        key = line[:pos]
        before: Values | None = None
        old_columns: tuple[Column, ...] = ()
        if line.startswith(" old-key:", pos):
            end = self._tuples.columns_end(line, pos + 9)
            if not line.startswith(" new-tuple:", end):
                # report the offset of the bad item, or of the missing marker
                self._tuples.parse(line, pos + 9, len(line))
                raise fail("expected ' new-tuple:'", end, "UPDATE")
            old_columns, before, _ = self._tuples.parse(line, pos + 9, end)
            pos = end + 11
        if pos + 16 == len(line) and line.endswith(_NO_TUPLE):
            return RowChange(Op.UPDATE, schema, table, old_columns, before, None, xid=xid, lsn=lsn)
        columns, after, toast = self._tuples.parse_cached(line, pos, key)
        return RowChange(Op.UPDATE, schema, table, columns, before, after, toast, xid=xid, lsn=lsn)

    def _delete(
        self, line: str, pos: int, schema: str, table: str, lsn: int | None, xid: int | None
    ) -> RowChange:
        if pos + 16 == len(line) and line.endswith(_NO_TUPLE):
            return RowChange(Op.DELETE, schema, table, (), None, None, xid=xid, lsn=lsn)
        columns, before, _ = self._tuples.parse_cached(line, pos, line[:pos])
        return RowChange(Op.DELETE, schema, table, columns, before, None, xid=xid, lsn=lsn)

    # ---- messages -----------------------------------------------------------------

    def _message(
        self, line: str, pos: int, lsn: int | None, xid: int | None
    ) -> LogicalMessage:
        transactional, prefix_start = self._message_head(line, pos)
        search = prefix_start
        while True:
            k = line.find(", sz: ", search)
            if k < 0:
                raise fail("no ', sz: N content:' whose size fits the content", prefix_start)
            m = _SZ_RE.match(line, k)
            if m is not None:
                tail = line[m.end() :]
                if _utf8_len(tail) == int(m.group(1)):
                    return LogicalMessage(
                        transactional=transactional,
                        prefix=line[prefix_start:k],
                        content=tail.encode("utf-8", "surrogateescape"),
                        xid=xid,
                        lsn=lsn,
                    )
            search = k + 1

    @staticmethod
    def _message_head(line: str, pos: int) -> tuple[bool, int]:
        flag = line[pos : pos + 1]
        if flag not in ("0", "1") or not line.startswith(" prefix: ", pos + 1):
            raise fail("expected '0 prefix: ' or '1 prefix: '", pos, "message")
        return flag == "1", pos + 10

    # ---- two-phase lines --------------------------------------------------------

    @staticmethod
    def _gid_line(
        line: str, pos: int, xid: int | None, kind: str
    ) -> tuple[str, int | None, datetime | None]:
        gid, pos = scan_gid(line, pos)
        m = _GID_TAIL_RE.match(line, pos)
        if m is None:
            raise fail(f"bad {kind} line", pos, kind)
        ts = parse_timestamp(m.group(2), m.start(2)) if m.group(2) is not None else None
        return gid, _xid(m.group(1), xid, pos), ts

    # ---- streaming lines --------------------------------------------------------

    def _streaming(self, line: str, lsn: int | None, xid: int | None) -> Event:
        for head, regex in _STREAM_RES.items():
            if line.startswith(head):
                m = regex.match(line)
                if m is None:
                    raise fail(f"bad '{head.strip()}' line", len(head), head.strip())
                txn = _xid(m.group(1), xid, len(head))
                if head[0] == "o":
                    return StreamStart(xid=txn or 0, lsn=lsn)
                if head[0] == "c":
                    return StreamStop(lsn=lsn)
                if head[0] == "a":
                    return StreamAbort(xid=txn or 0, subxid=txn or 0, lsn=lsn, abort_lsn=lsn)
                return Ignored(STREAM_CHANGE if head[10] == "c" else STREAM_TRUNCATE, lsn=lsn)
        if line.startswith("committing streamed transaction"):
            m = _STREAM_COMMIT_RE.match(line)
            if m is None:
                raise fail("bad 'committing streamed transaction' line", 31, "stream commit")
            ts = parse_timestamp(m.group(2), m.start(2)) if m.group(2) is not None else None
            txn = _xid(m.group(1), xid, 32)
            return StreamCommit(xid=txn or 0, lsn=lsn, end_lsn=lsn, commit_ts=ts)
        if line.startswith("preparing streamed transaction "):
            pos = 31
            if line.startswith("TXN ", pos):
                pos += 4
            gid, txn, ts = self._gid_line(line, pos, xid, "stream prepare")
            return Prepare(
                xid=txn, gid=gid, lsn=lsn, end_lsn=lsn, prepare_ts=ts, streamed=True
            )
        if line.startswith(_STREAM_MESSAGE_HEAD):
            pos = len(_STREAM_MESSAGE_HEAD)
            transactional, prefix_start = self._message_head(line, pos)
            if not transactional:
                return self._message(line, pos, lsn, xid)
            m = None
            k = line.rfind(", sz: ")
            if k >= prefix_start:
                m = _STREAM_SZ_RE.match(line, k)
            if m is None:
                raise fail("expected ', sz: N' at the end", prefix_start, "streaming message")
            return Ignored(STREAM_MESSAGE, lsn=lsn)
        raise fail("not a test_decoding line", 0)
