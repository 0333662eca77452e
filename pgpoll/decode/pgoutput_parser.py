"""pgoutput parsing: one binary output row to its protocol message, dispatched on the first byte.

Stateless and pure. The first byte selects the message class of
:mod:`pgpoll.decode.pgoutput_messages` through a table that also records the
lowest protocol version sending it; an unknown byte raises
``DecodeError("unsupported message type ...")``. The caller says whether the
message was sent inside a Stream Start / Stream Stop block (``in_stream``),
because that is when protocol 2+ adds an Int32 xid to Insert, Update, Delete,
Truncate, Message, Relation and Type. The stateful decoder
(:mod:`pgpoll.decode.pgoutput_decoder`) builds on this.
"""

from __future__ import annotations

from collections.abc import Callable

from pgpoll.decode import pgoutput_messages as m
from pgpoll.decode.wire import Buffer, Reader
from pgpoll.errors import ConfigError, DecodeError

__all__ = ["MAX_PROTO_VERSION", "check_proto_version", "parse_message"]

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


def check_proto_version(proto_version: int) -> None:
    """Raise :class:`ConfigError` unless ``proto_version`` is one pgpoll decodes (1-4)."""
    if not 1 <= proto_version <= MAX_PROTO_VERSION:
        raise ConfigError(f"unsupported pgoutput proto_version {proto_version}", "use 1 to 4")


def parse_message(data: Buffer, proto_version: int, *, in_stream: bool = False) -> m.PgoutputMessage:
    """Parse one pgoutput message into its protocol dataclass.

    ``proto_version`` is the ``proto_version`` option of the peek (1-4);
    ``in_stream`` is True for messages between Stream Start and Stream Stop.
    Raises :class:`DecodeError` for an empty message, an unknown type byte, a
    message the protocol version cannot send, a field past the end, bad
    flags or tuple types, and trailing bytes.
    """
    check_proto_version(proto_version)
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
