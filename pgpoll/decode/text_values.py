"""Scanners for the pieces of a test_decoding line: names, tuples, literals, timestamps.

Each scanner takes the whole line and a start offset and returns what it read
plus the offset after it, so a failure can name the exact character offset.
They follow what ``contrib/test_decoding/test_decoding.c`` prints (PostgreSQL
15 to 18):

* relation names: ``quote_qualified_identifier`` -- ``schema.name``, each part
  bare (``[a-z0-9_]``) or double-quoted with ``"`` doubled;
* a column: `` name[type]:value`` (``tuple_to_stringinfo``), the name through
  ``quote_identifier``, the type through ``format_type_be`` (may hold spaces,
  dots, quotes, and ends in ``[]`` for arrays);
* a value (``print_literal``): numbers bare (``NaN``, ``Infinity``,
  ``-Infinity`` too), bits as ``B'0101'``, booleans as ``true``/``false``,
  everything else single-quoted with ``'`` doubled (backslashes as they are);
  ``null`` for NULL and ``unchanged-toast-datum`` for an unchanged on-disk
  TOAST value;
* a GID: ``quote_literal_cstr`` -- ``'...'`` with ``'`` doubled, or
  ``E'...'`` with ``'`` and ``\\`` doubled when it holds a backslash;
* a timestamp: ``timestamptz_to_str`` -- always ISO,
  ``2026-11-22 01:53:54.095995+00``.

No I/O; every failure raises :class:`pgpoll.errors.DecodeError` with an offset.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from pgpoll.changes import Column
from pgpoll.errors import DecodeError

# One part of a qualified name: bare, or double-quoted with "" inside.
_IDENT = r'(?:([^\s".:,\[\]]+)|"((?:[^"]|"")*)")'
_QNAME_RE = re.compile(_IDENT + r"\." + _IDENT)
# Pieces of one column, `` name[type]:value``. Quoted parts use the unrolled
# form ``"[^"]*(?:""[^"]*)*"`` so no input makes the engine backtrack badly.
_QUOTED_IDENT = r'"[^"]*(?:""[^"]*)*"'
_NAME = r'([^ "\[\]]+|' + _QUOTED_IDENT + r")"
_TYPE = r'([^\[\]"]*(?:(?:' + _QUOTED_IDENT + r'|\[\])[^\[\]"]*)*)'
_BARE = (
    r"null|unchanged-toast-datum|true|false|NaN|-?Infinity"
    r"|[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
)
_VALUE = r"('[^']*(?:''[^']*)*'|B'[01]*'|" + _BARE + r")(?= |\Z)"
#: One column; groups: raw name, type, raw value token.
_COLUMN_RE = re.compile(" " + _NAME + r"\[" + _TYPE + r"\]:" + _VALUE)
#: A run of columns (used to find where the ``old-key:`` side ends).
_COLUMNS_RE = re.compile(r"(?: " + _NAME + r"\[" + _TYPE + r"\]:" + _VALUE + ")*")
_TIMESTAMP_RE = re.compile(
    r"([0-9]{4,})-([0-9][0-9])-([0-9][0-9]) ([0-9][0-9]):([0-9][0-9]):([0-9][0-9])(?:\.([0-9]{1,6}))?"
    r"([+-])([0-9][0-9])(?::([0-9][0-9]))?(?::([0-9][0-9]))?\Z"
)

_TZ_CACHE: dict[str, timezone] = {}


def fail(message: str, offset: int, message_type: str | None = None) -> DecodeError:
    """Build the :class:`DecodeError` for a failure at character ``offset``."""
    return DecodeError(
        f"test_decoding: {message} at character {offset}",
        "check that the slot uses the test_decoding plugin and the line is complete",
        offset=offset,
        message_type=message_type,
    )


def scan_qualified_name(line: str, pos: int) -> tuple[str, str, int]:
    """Read ``schema.name`` at ``pos``; return ``(schema, name, end)``."""
    m = _QNAME_RE.match(line, pos)
    if m is None:
        raise fail("expected a qualified relation name", pos)
    bare_schema, quoted_schema, bare_name, quoted_name = m.groups()
    schema = bare_schema if bare_schema is not None else quoted_schema.replace('""', '"')
    name = bare_name if bare_name is not None else quoted_name.replace('""', '"')
    return schema, name, m.end()


def scan_quoted(line: str, pos: int) -> tuple[str, int]:
    """Read a ``'...'`` literal (``''`` escapes) at ``pos``; return ``(text, end)``."""
    if not line.startswith("'", pos):
        raise fail("expected a quoted value", pos)
    j = line.find("'", pos + 1)
    while j >= 0 and line.startswith("'", j + 1):
        j = line.find("'", j + 2)
    if j < 0:
        raise fail("unterminated quoted value", pos)
    raw = line[pos + 1 : j]
    return (raw.replace("''", "'") if "''" in raw else raw), j + 1


def scan_gid(line: str, pos: int) -> tuple[str, int]:
    """Read a ``quote_literal_cstr`` literal (``'...'`` or ``E'...'``) at ``pos``."""
    if line.startswith("E'", pos):
        text, end = scan_quoted(line, pos + 1)
        return text.replace("\\\\", "\\"), end
    return scan_quoted(line, pos)


def parse_timestamp(text: str, offset: int) -> datetime:
    """Parse ``timestamptz_to_str`` output into an aware :class:`datetime`."""
    m = _TIMESTAMP_RE.match(text)
    if m is None:
        raise fail(f"bad timestamp {text!r}", offset)
    year, month, day, hour, minute, second, frac, sign, tzh, tzm, tzs = m.groups()
    tzkey = text[m.start(8) :]
    tz = _TZ_CACHE.get(tzkey)
    if tz is None:
        delta = timedelta(hours=int(tzh), minutes=int(tzm or 0), seconds=int(tzs or 0))
        tz = timezone(-delta if sign == "-" else delta)
        _TZ_CACHE[tzkey] = tz
    try:
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int(frac.ljust(6, "0")) if frac else 0,
            tzinfo=tz,
        )
    except ValueError as exc:
        raise fail(f"bad timestamp {text!r} ({exc})", offset) from None


def _name(raw: str) -> str:
    return raw[1:-1].replace('""', '"') if raw[0] == '"' else raw


class _Template:
    """A regex specialised to one relation's column list (names and types fixed)."""

    __slots__ = ("columns", "names", "raw", "regex")

    def __init__(self, raw: list[tuple[str, str]], columns: tuple[Column, ...]) -> None:
        self.raw = raw  # each column's name and type as printed
        self.regex = re.compile(
            "".join(" " + re.escape(n) + r"\[" + re.escape(t) + r"\]:" + _VALUE for n, t in raw)
            + r"\Z"
        )
        self.columns = columns
        self.names = tuple(c.name for c in columns)


Values = dict[str, str | None]
Parsed = tuple[tuple[Column, ...], Values, tuple[str, ...]]


class TupleParser:
    """Parses the column list of a row line.

    Keeps a bounded cache of :class:`Column` objects and, per line header
    (``table s.t: INSERT:``), a regex specialised to that relation's columns,
    so the common case costs one regex match plus one pass over the values.
    One instance per decoder.
    """

    __slots__ = ("_columns", "_templates")

    _CACHE_LIMIT = 4096

    def __init__(self) -> None:
        self._columns: dict[tuple[str, str], Column] = {}
        self._templates: dict[str, _Template] = {}

    def parse_cached(self, line: str, pos: int, key: str) -> Parsed:
        """Like :meth:`parse` to the end of the line, through the template for ``key``."""
        template = self._templates.get(key)
        if template is not None:
            m = template.regex.match(line, pos)
            if m is not None:
                # the value rules of _convert, inlined: this is the per-line hot path
                values: Values = {}
                toast: list[str] = []
                for name, raw in zip(template.names, m.groups()):  # noqa: B905 -- equal by construction; a keyword costs on this hot path
                    c = raw[0]
                    if c == "'":
                        raw = raw[1:-1]
                        if "''" in raw:
                            raw = raw.replace("''", "'")
                    elif c == "n":
                        raw = None
                    elif c == "B":
                        raw = raw[2:-1]
                    elif c == "u":
                        toast.append(name)
                        continue
                    values[name] = raw
                return template.columns, values, tuple(toast)
        found = _COLUMN_RE.findall(line, pos)
        parsed = self._convert(line, pos, len(line), found)
        if len(self._templates) >= self._CACHE_LIMIT:
            self._templates.clear()
        self._templates[key] = _Template([(n, t) for n, t, _ in found], parsed[0])
        return parsed

    def layout(self, key: str) -> tuple[list[tuple[str, str]], tuple[str, ...]] | None:
        """The columns cached for ``key``: each ``(name, type)`` as printed, and the names as decoded."""
        template = self._templates.get(key)
        return None if template is None else (template.raw, template.names)

    def parse(self, line: str, pos: int, end: int) -> Parsed:
        """Read `` name[type]:value`` items from ``line[pos:end]``.

        Returns ``(columns, values, unchanged_toast)``: unchanged TOAST
        columns are in ``columns`` and ``unchanged_toast`` but not in
        ``values``. Raises :class:`DecodeError` unless the items cover the
        whole range.
        """
        return self._convert(line, pos, end, _COLUMN_RE.findall(line, pos, end))

    @staticmethod
    def columns_end(line: str, pos: int) -> int:
        """Offset where the run of columns starting at ``pos`` ends."""
        m = _COLUMNS_RE.match(line, pos)
        return m.end() if m is not None else pos

    def _column(self, raw_name: str, type_name: str) -> Column:
        key = (raw_name, type_name)
        col = self._columns.get(key)
        if col is None:
            if len(self._columns) >= self._CACHE_LIMIT:
                self._columns.clear()
            col = self._columns[key] = Column(_name(raw_name), type_name)
        return col

    def _convert(self, line: str, pos: int, end: int, found: list[tuple[str, str, str]]) -> Parsed:
        columns: list[Column] = []
        values: Values = {}
        toast: list[str] = []
        covered = pos
        for raw_name, type_name, raw in found:
            col = self._column(raw_name, type_name)
            columns.append(col)
            covered += len(raw_name) + len(type_name) + len(raw) + 4
            c = raw[0]
            value: str | None = raw
            if c == "'":
                value = raw[1:-1]
                if "''" in value:
                    value = value.replace("''", "'")
            elif c == "n":
                value = None
            elif c == "B":
                value = raw[2:-1]
            elif c == "u":
                toast.append(col.name)
                continue
            values[col.name] = value
        if covered != end:
            raise self._error(line, pos, end)
        return tuple(columns), values, tuple(toast)

    @staticmethod
    def _error(line: str, pos: int, end: int) -> DecodeError:
        """Find the first offset in ``line[pos:end]`` that is not a column."""
        while pos < end:
            m = _COLUMN_RE.match(line, pos, end)
            if m is None:
                break
            pos = m.end()
        if line.startswith(" ", pos) and _COLUMN_RE.match(line, pos) is None:
            head = re.match(" " + _NAME + r"\[" + _TYPE + r"\]:", line[pos:end])
            if head is not None:
                return fail("bad value", pos + head.end())
        return fail("expected ' name[type]:value'", pos)
