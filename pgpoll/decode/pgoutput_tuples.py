"""pgoutput relations and tuple values: what the decoder's hot path reads rows with.

Two readers of one TupleData, kept side by side so they can be checked
against each other (the fuzz tests do): :func:`read_tuple` is the fast one
(precompiled unpackers, one loop, no bounds check per column; the caller
checks the end offset and falls back on any error), :func:`tuple_values` turns
the bounds-checked parser's :class:`~pgpoll.decode.pgoutput_messages.TupleData`
into the same list. Both give the values of :data:`pgpoll.changes.RowFields`:
``'t'`` text as ``str`` (UTF-8), ``'n'`` as ``None``, ``'u'`` as
:data:`~pgpoll.changes.UNCHANGED_TOAST`, and ``'b'`` (binary, option
``binary 'true'``) as hex text ``'\\x0a0b...'`` of the type's *binary send
form* -- for ``bytea`` that equals PostgreSQL's own text output (``bytea_output
= hex``); for other types a consumer must decode it by type OID.

:class:`PgoutputRelation` is a Relation message prepared for the hot path.
"""

from __future__ import annotations

import struct

from pgpoll import changes as ch
from pgpoll.changes import UNCHANGED_TOAST, Value
from pgpoll.decode import pgoutput_messages as m
from pgpoll.decode.wire import unpack_uint16, unpack_uint32
from pgpoll.errors import DecodeError

__all__ = ["BOOL_TEXT", "FAST_PATH_ERRORS", "MalformedError", "PgoutputRelation", "read_tuple", "tuple_values"]

_BOOL_OID = 16
#: boolout prints ``t``/``f``; ``bool::text`` (and test_decoding) print ``true``/``false``.
BOOL_TEXT = {"t": "true", "f": "false"}
_u16 = unpack_uint16
_u32 = unpack_uint32


class PgoutputRelation(ch.RelationInfo):
    """What a Relation message told the decoder, prepared for the hot path.

    Adds to :class:`~pgpoll.changes.RelationInfo` the positions of boolean
    columns (``bool_indexes``, whose ``t``/``f`` the decoder rewrites) and the
    Relation ``message`` itself. The key columns are those flagged with bit 1.
    """

    __slots__ = ("bool_indexes", "message")

    def __init__(self, rel: m.Relation) -> None:
        super().__init__(
            rel.relation_id,
            rel.schema,
            rel.name,
            tuple(ch.Column(c.name, None, c.type_oid, c.type_modifier, c.is_key) for c in rel.columns),
            rel.replica_identity,
        )
        self.bool_indexes = tuple(i for i, c in enumerate(rel.columns) if c.type_oid == _BOOL_OID)
        self.message = rel


class MalformedError(Exception):
    """Internal: the fast path saw something it does not handle; re-read slowly."""


#: What the fast path catches to fall back to the checked parser.
FAST_PATH_ERRORS = (MalformedError, IndexError, struct.error, UnicodeDecodeError)


def read_tuple(data: bytes, pos: int) -> tuple[list[Value], int]:
    """Read one TupleData at ``pos``; return its values and the next offset.

    Bounds are not checked per column: slices past the end are short, so the
    caller's final ``pos == len(data)`` check (offsets only grow) catches them.
    Raises one of :data:`FAST_PATH_ERRORS` on anything else it cannot read.
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
            raise MalformedError
    return vals, pos


def tuple_values(tup: m.TupleData | None, name: str) -> list[Value] | None:
    """A parsed TupleData as :func:`read_tuple` gives it (the slow path's twin); ``name`` is the message's."""
    if tup is None:
        return None
    out: list[Value] = []
    for i, (kind, raw) in enumerate(zip(tup.kinds, tup.values, strict=False)):
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
