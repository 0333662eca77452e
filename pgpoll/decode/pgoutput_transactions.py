"""The pgoutput messages that frame transactions, one frozen dataclass each (protocol versions 1-4).

Begin, Commit and Origin; Stream Start, Stop, Commit and Abort (protocol 2+,
``streaming``); Begin Prepare, Prepare, Stream Prepare, Commit Prepared and
Rollback Prepared (protocol 3+, ``two_phase``). The messages that carry a
relation's description or rows are in :mod:`pgpoll.decode.pgoutput_messages`,
whose conventions hold here too (field layout in each docstring, in wire order
after the type byte; xids, OIDs and LSNs unsigned; ``Int8(0)`` flags must be 0)
and which re-exports every class of this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgpoll.decode.wire import Reader


def _flags0(r: Reader) -> int:
    pos = r.pos
    flags = r.read_uint8("Int8 flags")
    if flags:
        raise r.error(f"unrecognized flags {flags}", pos)
    return flags


@dataclass(frozen=True, slots=True)
class Begin:
    """Begin ``'B'``: Int64 final LSN (commit record start), Int64 commit timestamp, Int32 xid."""

    final_lsn: int
    commit_ts: datetime
    xid: int

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Begin:
        return cls(r.read_uint64("final LSN"), r.read_timestamp("commit timestamp"), r.read_uint32("xid"))


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ``'C'``: Int8(0) flags, Int64 commit LSN, Int64 end LSN, Int64 commit timestamp."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Commit:
        return cls(_flags0(r), r.read_uint64("commit LSN"), r.read_uint64("end LSN"), r.read_timestamp())


@dataclass(frozen=True, slots=True)
class Origin:
    """Origin ``'O'``: Int64 LSN of the commit on the origin server, String origin name."""

    commit_lsn: int
    name: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Origin:
        return cls(r.read_uint64("origin commit LSN"), r.read_string("origin name"))


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Stream Start ``'S'`` (protocol 2+): Int32 xid, Int8 1 for the xid's first segment else 0."""

    xid: int
    first_segment: bool

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> StreamStart:
        xid = r.read_uint32("xid")
        return cls(xid, r.read_uint8("first segment flag") == 1)


@dataclass(frozen=True, slots=True)
class StreamStop:
    """Stream Stop ``'E'`` (protocol 2+): no fields."""

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> StreamStop:
        return cls()


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Stream Commit ``'c'`` (protocol 2+): Int32 xid, Int8(0) flags, Int64 commit LSN, Int64 end LSN, Int64 commit timestamp."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> StreamCommit:
        xid, flags = r.read_uint32("xid"), _flags0(r)
        return cls(xid, flags, r.read_uint64("commit LSN"), r.read_uint64("end LSN"), r.read_timestamp())


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Stream Abort ``'A'`` (protocol 2+)::

        Int32 (TransactionId)  xid of the transaction
        Int32 (TransactionId)  xid of the subtransaction (= xid for a top-level abort)
        Int64 (XLogRecPtr)     abort LSN: only with streaming 'parallel' (protocol 4+)
        Int64 (TimestampTz)    abort timestamp: only with streaming 'parallel' (protocol 4+)

    Nothing can follow the xids but the two optional fields, so their presence
    is read from the message length; ``None`` when not sent.
    """

    xid: int
    subxid: int
    abort_lsn: int | None
    abort_ts: datetime | None

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> StreamAbort:
        xid, subxid = r.read_uint32("xid"), r.read_uint32("subtransaction xid")
        if r.remaining:
            return cls(xid, subxid, r.read_uint64("abort LSN"), r.read_timestamp("abort timestamp"))
        return cls(xid, subxid, None, None)


def _two_phase_fields(r: Reader, lsn_name: str) -> tuple[int, int, datetime, int, str]:
    """Int64 LSN, Int64 end LSN, Int64 timestamp, Int32 xid, String gid: the common tail of
    Begin Prepare, Prepare, Stream Prepare and Commit Prepared (read in that order)."""
    lsn, end, ts = r.read_uint64(lsn_name), r.read_uint64("end LSN"), r.read_timestamp()
    return lsn, end, ts, r.read_uint32("xid"), r.read_string("gid")


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """Begin Prepare ``'b'`` (protocol 3+): Int64 prepare LSN, Int64 end LSN, Int64 prepare timestamp, Int32 xid, String gid."""

    prepare_lsn: int
    end_lsn: int
    prepare_ts: datetime
    xid: int
    gid: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> BeginPrepare:
        return cls(*_two_phase_fields(r, "prepare LSN"))


@dataclass(frozen=True, slots=True)
class Prepare:
    """Prepare ``'P'`` (protocol 3+): Int8(0) flags, Int64 prepare LSN, Int64 end LSN, Int64 prepare timestamp,
    Int32 xid, String gid."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: datetime
    xid: int
    gid: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> Prepare:
        return cls(_flags0(r), *_two_phase_fields(r, "prepare LSN"))


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    """Stream Prepare ``'p'`` (protocol 3+, streaming): the fields of :class:`Prepare`."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: datetime
    xid: int
    gid: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> StreamPrepare:
        return cls(_flags0(r), *_two_phase_fields(r, "prepare LSN"))


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """Commit Prepared ``'K'`` (protocol 3+): Int8(0) flags, Int64 commit LSN, Int64 end LSN, Int64 commit timestamp,
    Int32 xid, String gid."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime
    xid: int
    gid: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> CommitPrepared:
        return cls(_flags0(r), *_two_phase_fields(r, "commit LSN"))


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """Rollback Prepared ``'r'`` (protocol 3+)::

        Int8(0)                flags
        Int64 (XLogRecPtr)     end LSN of the prepared transaction
        Int64 (XLogRecPtr)     end LSN of the rollback
        Int64 (TimestampTz)    prepare timestamp
        Int64 (TimestampTz)    rollback timestamp
        Int32 (TransactionId)  xid
        String                 gid
    """

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_ts: datetime
    rollback_ts: datetime
    xid: int
    gid: str

    @classmethod
    def read(cls, r: Reader, in_stream: bool) -> RollbackPrepared:
        flags, prep_end, end = _flags0(r), r.read_uint64("prepare end LSN"), r.read_uint64("rollback end LSN")
        prep_ts, ts = r.read_timestamp("prepare timestamp"), r.read_timestamp("rollback timestamp")
        return cls(flags, prep_end, end, prep_ts, ts, r.read_uint32("xid"), r.read_string("gid"))
