"""Group decoded events into committed transactions and emit change records.

:class:`TransactionAssembler` is fed the events of one peek in order (from
either plugin's decoder) and returns :class:`~pgpoll.changes.ChangeRecord`
envelopes when they are final:

* rows, truncates and transactional messages between ``Begin`` and
  ``Commit`` come out at the commit, with ``commit_lsn`` = the COMMIT row's
  ``lsn`` (``Commit.lsn``, else ``Commit.end_lsn``), the transaction's xid and
  commit timestamp, and a 0-based ``seq``; a TRUNCATE of n tables becomes n
  records (op ``T``) with consecutive ``seq``;
* a non-transactional message comes out at once: ``commit_lsn`` = its
  ``lsn``, ``seq`` 0, no xid or commit timestamp;
* streamed chunks (``StreamStart`` .. ``StreamStop``) are buffered per
  top-level xid until ``StreamCommit``; ``StreamAbort`` drops the whole
  buffer when ``subxid == xid`` and otherwise the buffered events whose
  ``xid`` is ``subxid`` (pgoutput marks each streamed change with its
  subtransaction's xid);
* a prepared transaction (``Prepare``, streamed or not) is kept until
  ``CommitPrepared`` (emitted then, with that row's lsn) or dropped at
  ``RollbackPrepared``;
* a change outside any transaction or stream (test_decoding prints some: a
  PG15 transactional message under ``skip-empty-xacts``, or lines fed without
  their frame) comes out at once with ``commit_lsn``, ``xid`` and
  ``commit_ts`` None.

What test_decoding does not allow: its streaming lines carry no row data
(see :mod:`pgpoll.decode.text_decoder`). Such changes are counted per
stream; committing a stream that holds any raises :class:`DecodeError`
unless ``allow_opaque_streams`` is set, in which case they are skipped. Its
stream-abort line does not say which subtransaction a change belonged to, so
a subtransaction abort cannot un-count them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pgpoll.changes import (
    Begin,
    BeginPrepare,
    ChangeRecord,
    Commit,
    CommitPrepared,
    Event,
    Ignored,
    LogicalMessage,
    Prepare,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from pgpoll.decode.change_json import Change, change_record_to_json, iter_records, records_for
from pgpoll.decode.text_decoder import OPAQUE_STREAM_KINDS
from pgpoll.errors import DecodeError
from pgpoll.lsn import Lsn

__all__ = ["TransactionAssembler", "change_record_to_json"]


@dataclass
class _Txn:
    """Changes buffered for one transaction (open, streamed or prepared)."""

    xid: int | None
    commit_ts: datetime | None = None
    first_lsn: int | None = None  # the BEGIN row's (or first stream block's) lsn
    changes: list[Change] = field(default_factory=list)
    opaque: int = 0  # streamed changes whose data the plugin did not print


class TransactionAssembler:
    """Turns a stream of events into committed :class:`ChangeRecord` s.

    Parameters
    ----------
    allow_opaque_streams:
        Skip, instead of failing on, streamed changes whose data the plugin
        did not print (test_decoding with ``stream-changes``).

    Examples
    --------
    >>> asm = TransactionAssembler()
    >>> asm.feed(Begin(xid=7, lsn=100))
    []
    >>> asm.in_transaction
    True
    """

    def __init__(self, *, allow_opaque_streams: bool = False) -> None:
        self._allow_opaque = allow_opaque_streams
        self._txn: _Txn | None = None
        self._stream: _Txn | None = None  # the stream block being read
        self._streams: dict[int, _Txn] = {}
        self._prepared: dict[str, _Txn] = {}
        self._unmatched: list[str] = []

    # ---- state ----------------------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        """True between a ``Begin`` and its ``Commit``/``Prepare``, or inside a stream block."""
        return self._txn is not None or self._stream is not None

    @property
    def open_streams(self) -> tuple[int, ...]:
        """Top-level xids of streamed transactions not yet committed or aborted."""
        return tuple(self._streams)

    @property
    def pending_prepared(self) -> tuple[str, ...]:
        """GIDs prepared in the input and not yet committed or rolled back."""
        return tuple(self._prepared)

    @property
    def hold_lsn(self) -> int | None:
        """The lowest LSN of unfinished work: do not advance the slot past it.

        The BEGIN row's lsn of the open transaction and of every prepared
        transaction not yet resolved, and the first stream-block lsn of every
        open stream; None when nothing is pending (or no lsn is known). With a
        two-phase slot, advancing past a pending PREPARE loses its changes:
        the server later sends only ``COMMIT PREPARED``.
        """
        pending = [self._txn] if self._txn is not None else []
        pending += list(self._streams.values()) + list(self._prepared.values())
        lsns = [t.first_lsn for t in pending if t.first_lsn is not None]
        return min(lsns) if lsns else None

    @property
    def unmatched_commit_prepared(self) -> tuple[str, ...]:
        """GIDs whose COMMIT PREPARED came without their PREPARE in this input.

        Their changes were sent when the slot decoded the PREPARE (an earlier
        peek); if the slot was advanced past it they are lost.
        """
        return tuple(self._unmatched)

    # ---- feeding -----------------------------------------------------------------------

    def feed(self, event: Event) -> list[ChangeRecord]:
        """Take the next event; return the records it completes (often none)."""
        return list(self._feed(event))

    def _feed(self, event: Event) -> Iterable[ChangeRecord]:
        if isinstance(event, (RowChange, Truncate)):
            target = self._stream or self._txn
            if target is not None:
                target.changes.append(event)
                return []
            return records_for((event,), None, None, None)
        if isinstance(event, LogicalMessage):
            return self._message(event)
        if isinstance(event, (Begin, BeginPrepare)):
            self._require_idle(event)
            ts = event.commit_ts if isinstance(event, Begin) else None
            self._txn = _Txn(event.xid, ts, event.lsn)
            return []
        if isinstance(event, Commit):
            txn = self._take_txn(event)
            return iter_records(
                txn.changes,
                event.lsn if event.lsn is not None else event.end_lsn,
                txn.xid if txn.xid is not None else event.xid,
                event.commit_ts or txn.commit_ts,
            )
        if isinstance(event, Ignored):
            if event.kind in OPAQUE_STREAM_KINDS:
                self._opaque(event)
            return []
        return self._two_phase_or_stream(event)

    def finish(self) -> list[ChangeRecord]:
        """End of input: forget unfinished work and reset; returns no records.

        Nothing uncommitted is ever emitted. Check :attr:`in_transaction`,
        :attr:`open_streams` and :attr:`pending_prepared` first to learn
        whether the input stopped inside a transaction.
        """
        self._txn = None
        self._stream = None
        self._streams.clear()
        self._prepared.clear()
        self._unmatched.clear()
        return []

    # ---- helpers ------------------------------------------------------------------------

    def _message(self, event: LogicalMessage) -> list[ChangeRecord]:
        if not event.transactional:
            return records_for((event,), event.lsn, None, None)
        target = self._stream or self._txn
        if target is not None:
            target.changes.append(event)
            return []
        return records_for((event,), None, None, None)

    def _opaque(self, event: Ignored) -> None:
        if self._stream is not None:
            self._stream.opaque += 1
        elif not self._allow_opaque:
            raise _error(f"streamed change ({event.kind}) outside a stream block", event.lsn)

    def _require_idle(self, event: Event) -> None:
        if self._txn is not None:
            raise _error(
                f"{type(event).__name__} inside open transaction {self._txn.xid}", _lsn(event)
            )
        if self._stream is not None:
            raise _error(f"{type(event).__name__} inside a stream block", _lsn(event))

    def _take_txn(self, event: Event) -> _Txn:
        txn = self._txn
        if txn is None:
            raise _error(f"{type(event).__name__} without a transaction", _lsn(event))
        self._txn = None
        return txn

    def _two_phase_or_stream(self, event: Event) -> Iterable[ChangeRecord]:
        if isinstance(event, StreamStart):
            self._require_idle(event)
            self._stream = self._streams.setdefault(event.xid, _Txn(event.xid, None, event.lsn))
        elif isinstance(event, StreamStop):
            self._stream = None
        elif isinstance(event, StreamAbort):
            if event.subxid == event.xid:
                dropped = self._streams.pop(event.xid, None)
                if dropped is not None and dropped is self._stream:
                    self._stream = None
            elif event.xid in self._streams:
                stream = self._streams[event.xid]
                stream.changes = [c for c in stream.changes if c.xid != event.subxid]
        elif isinstance(event, StreamCommit):
            committed = self._streams.pop(event.xid, None) or _Txn(event.xid)
            return self._commit(committed, event.lsn, event.end_lsn, event.xid, event.commit_ts)
        elif isinstance(event, Prepare):
            txn = self._stream_for(event) if event.streamed else self._take_txn(event)
            if txn.xid is None:
                txn.xid = event.xid
            self._prepared[event.gid or ""] = txn
        elif isinstance(event, CommitPrepared):
            gid = event.gid or ""
            prepared = self._prepared.pop(gid, None)
            if prepared is None:
                self._unmatched.append(gid)
                return []
            return self._commit(prepared, event.lsn, event.end_lsn, event.xid, event.commit_ts)
        elif isinstance(event, RollbackPrepared):
            self._prepared.pop(event.gid or "", None)
        else:
            raise _error(f"unexpected event {type(event).__name__}", _lsn(event))
        return []

    def _stream_for(self, event: Prepare) -> _Txn:
        key = event.xid if event.xid is not None else 0
        if key not in self._streams and len(self._streams) == 1:
            key = next(iter(self._streams))  # test_decoding without include-xids
        return self._streams.pop(key, None) or _Txn(event.xid)

    def _commit(
        self,
        txn: _Txn,
        lsn: int | None,
        end_lsn: int | None,
        xid: int | None,
        commit_ts: datetime | None,
    ) -> Iterable[ChangeRecord]:
        if txn.opaque and not self._allow_opaque:
            raise _error(
                f"streamed transaction {txn.xid} holds {txn.opaque} change(s) the plugin "
                "did not print (test_decoding with stream-changes)",
                lsn,
                hint="peek test_decoding slots without the stream-changes option",
            )
        return iter_records(
            txn.changes,
            lsn if lsn is not None else end_lsn,
            txn.xid if txn.xid is not None else xid,
            commit_ts or txn.commit_ts,
        )


def _lsn(event: Event) -> int | None:
    return getattr(event, "lsn", None)


def _error(message: str, lsn: int | None, hint: str | None = None) -> DecodeError:
    return DecodeError(
        f"transaction assembly: {message}",
        hint or "feed the events of one peek in order, from its first row",
        lsn=str(Lsn(lsn)) if lsn is not None else None,
    )
