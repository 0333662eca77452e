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

import pyarrow as pa

from pgpoll.changes import Event, RelationInfo, RowFields
from pgpoll.decode.pgoutput_columns import MIN_RUN, PeekChunk, insert_run_after
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.decode.text_columns import insert_run_after as text_insert_run_after
from pgpoll.decode.text_columns import same_prefix_run
from pgpoll.decode.text_decoder import TestDecodingDecoder
from pgpoll.errors import ConfigError, DecodeError
from pgpoll.lsn import Lsn

__all__ = ["PLUGINS", "Decoder", "make_decoder"]

#: The output plugins pgpoll decodes.
PLUGINS = ("pgoutput", "test_decoding")

#: ``(chunk, first row, row after the last, relation id)`` -> the relation and the rows' ``after`` images, or ``None``.
InsertRun = Callable[[PeekChunk, int, int, int], "tuple[RelationInfo, pa.MapArray[Any, Any]] | None"]
#: ``(chunk, row just decoded as an INSERT, end of the chunk)`` -> ``(end, after images of the rows after it)``, or ``None``.
TextRun = Callable[[PeekChunk, int, int], "tuple[int, pa.MapArray[Any, Any]] | None"]


class Decoder(Protocol):
    """One peek's rows in order in, one :mod:`pgpoll.changes` event per row out.

    Calling it decodes one row: ``data`` is the peek's ``data`` column (bytes
    or a buffer), ``lsn`` and ``xid`` its other two columns where known.

    ``fast_row``, when not ``None``, is the fast path for row changes: it
    returns the plain :data:`~pgpoll.changes.RowFields` for an Insert, Update
    or Delete and ``None`` for every other row, which must then be decoded by
    calling the decoder (it may change the decoder's state). ``insert_run``,
    when not ``None``, decodes a run of Insert rows column-wise
    (:mod:`pgpoll.decode.pgoutput_columns`) or returns ``None`` to have them
    decoded row by row; ``text_run`` is test_decoding's counterpart
    (:mod:`pgpoll.decode.text_columns`). ``type_names`` maps a type OID to ``(schema, name)`` as the plugin described it so far
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
    def insert_run(self) -> InsertRun | None:
        """The column-wise path for runs of Inserts, or ``None``."""
        ...

    @property
    def text_run(self) -> TextRun | None:
        """The column-wise path for runs of test_decoding INSERT lines, or ``None``."""
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

    __slots__ = ("_decoder", "fast_row", "insert_run", "type_names")

    plugin = "pgoutput"
    text_run: TextRun | None = None

    def __init__(self, proto_version: int) -> None:
        self._decoder = PgoutputDecoder(proto_version)
        self.fast_row: Callable[[Any], RowFields | None] | None = self._decoder.decode_row
        self.insert_run: InsertRun | None = self._insert_run
        self.type_names: Mapping[int, tuple[str, str]] = self._decoder.types

    def __call__(self, data: Any, lsn: int | None, xid: int | None) -> Event:
        return self._decoder.decode(data, lsn)

    def _insert_run(self, chunk: PeekChunk, lo: int, hi: int, relid: int) -> tuple[RelationInfo, pa.MapArray[Any, Any]] | None:
        """Rows ``lo..hi`` of ``chunk`` (Inserts of relation ``relid``) column-wise, or ``None``: go row by row.

        Row by row also when the relation is unknown or a stream is open, so
        that the row path raises (or handles) it exactly as always.
        """
        rel = self._decoder.relations.get(relid)
        if rel is None or self._decoder.in_stream:
            return None
        after = insert_run_after(chunk, lo, hi, rel)
        return None if after is None else (rel, after)


class TextRows:
    """:class:`Decoder` for test_decoding: UTF-8 lines through :class:`TestDecodingDecoder`."""

    __slots__ = ("_decoder", "text_run")

    plugin = "test_decoding"
    fast_row: Callable[[Any], RowFields | None] | None = None
    insert_run: InsertRun | None = None
    type_names: Mapping[int, tuple[str, str]] = MappingProxyType({})

    def __init__(self) -> None:
        self._decoder = TestDecodingDecoder()
        self.text_run: TextRun | None = self._text_run

    def _text_run(self, chunk: PeekChunk, row: int, hi: int) -> tuple[int, pa.MapArray[Any, Any]] | None:
        """After row ``row`` of ``chunk`` decoded as an INSERT: the INSERTs right after it, column-wise.

        Returns ``(end, after)`` for rows ``row + 1 .. end`` (a piece of
        bounded size of the lines that start like row ``row``), or ``None``:
        go on row by row.
        """
        line = chunk.value(row)
        cut = line.find(b": INSERT:")
        if cut < 0:
            return None
        prefix = line[: cut + 9]
        layout = self._decoder.insert_layout(prefix.decode("utf-8", "replace"))
        if layout is None:
            return None
        if hi - row - 1 < MIN_RUN:
            return None
        end = same_prefix_run(chunk, row + 1, chunk.pieces(row + 1, hi)[0][1], prefix)  # a piece of bounded size
        if end - row - 1 < MIN_RUN:
            return None
        after = text_insert_run_after(chunk, row + 1, end, len(prefix), *layout)
        return None if after is None else (end, after)

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
