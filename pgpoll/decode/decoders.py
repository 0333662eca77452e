"""The decoder factory: one object per peek that turns a plugin's output rows into events.

Callers (the ingest task on the executor, ``pgpoll decode`` on the command
line) know the plugin only by name; :func:`make_decoder` picks the decoder and
hides what differs: pgoutput rows are bytes, test_decoding rows are UTF-8
text (a row that is not raises :class:`~pgpoll.errors.DecodeError`). Both
satisfy :class:`Decoder`, which also carries pgoutput's fast path
(``fast_row``, ``None`` for test_decoding) and the type names the plugin sent
(``type_names``), so the caller needs no ``if plugin ==``. Pure, like the rest
of :mod:`pgpoll.decode`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from pgpoll.changes import Event, RowFields
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.decode.text_decoder import TestDecodingDecoder
from pgpoll.errors import ConfigError, DecodeError
from pgpoll.lsn import Lsn

__all__ = ["PLUGINS", "Decoder", "make_decoder"]

#: The output plugins pgpoll decodes.
PLUGINS = ("pgoutput", "test_decoding")


class Decoder(Protocol):
    """One peek's rows in order in, one :mod:`pgpoll.changes` event per row out.

    Calling it decodes one row: ``data`` is the peek's ``data`` column (bytes
    or a buffer), ``lsn`` and ``xid`` its other two columns where known.

    ``fast_row``, when not ``None``, is the fast path for row changes: it
    returns the plain :data:`~pgpoll.changes.RowFields` for an Insert, Update
    or Delete and ``None`` for every other row, which must then be decoded by
    calling the decoder (it may change the decoder's state). ``type_names``
    maps a type OID to ``(schema, name)`` as the plugin described it so far
    (a live mapping; empty for plugins that print type names inline).
    """

    @property
    def plugin(self) -> str:
        """The output plugin's name."""
        ...

    @property
    def fast_row(self) -> Callable[[Any], RowFields | None] | None:
        """The row-change fast path, or ``None``."""
        ...

    @property
    def type_names(self) -> Mapping[int, tuple[str, str]]:
        """Type OID -> ``(schema, name)`` from the plugin."""
        ...

    def __call__(self, data: Any, lsn: int | None, xid: int | None) -> Event:
        """Decode one row."""
        ...


class PgoutputRows:
    """:class:`Decoder` for pgoutput: binary rows through :class:`PgoutputDecoder`."""

    __slots__ = ("_decoder", "fast_row", "type_names")

    plugin = "pgoutput"

    def __init__(self, proto_version: int) -> None:
        self._decoder = PgoutputDecoder(proto_version)
        self.fast_row: Callable[[Any], RowFields | None] | None = self._decoder.decode_row
        self.type_names: Mapping[int, tuple[str, str]] = self._decoder.types

    def __call__(self, data: Any, lsn: int | None, xid: int | None) -> Event:
        return self._decoder.decode(data, lsn)


class TextRows:
    """:class:`Decoder` for test_decoding: UTF-8 lines through :class:`TestDecodingDecoder`."""

    __slots__ = ("_decoder",)

    plugin = "test_decoding"
    fast_row: Callable[[Any], RowFields | None] | None = None
    type_names: Mapping[int, tuple[str, str]] = MappingProxyType({})

    def __init__(self) -> None:
        self._decoder = TestDecodingDecoder()

    def __call__(self, data: Any, lsn: int | None, xid: int | None) -> Event:
        try:
            line = data if type(data) is str else str(data, "utf-8")
        except UnicodeDecodeError as exc:
            where = str(Lsn(lsn)) if lsn is not None else None
            raise DecodeError(
                f"test_decoding row at {where} is not valid UTF-8 (byte {exc.start})",
                "the row is saved under _pgpoll/rejects/; once understood, skip it with:"
                " pgpoll slot advance SLOT <next COMMIT lsn>",
                offset=exc.start,
                lsn=where,
            ) from None
        return self._decoder.decode(line, lsn=lsn, xid=xid)


def make_decoder(plugin: str, proto_version: int = 1) -> Decoder:
    """The :class:`Decoder` for ``plugin`` (``proto_version`` is pgoutput's; test_decoding ignores it).

    Create one per peek: pgoutput's decoder caches the Relation messages that
    each peek sends again.

    >>> decode = make_decoder("test_decoding", 1)
    >>> decode(b"BEGIN 726", 0x16B1970, None)
    Begin(xid=726, lsn=23796080, final_lsn=None, commit_ts=None)
    """
    if plugin == "pgoutput":
        return PgoutputRows(proto_version)
    if plugin == "test_decoding":
        return TextRows()
    raise ConfigError(f"unknown output plugin {plugin!r}", f"use one of: {', '.join(PLUGINS)}")
