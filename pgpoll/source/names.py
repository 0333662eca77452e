"""Checks and quoting for user-given names (slots, publications, tables).

Names reach SQL only as bound parameters or through ``psycopg2.sql.Identifier``.
Slot names follow PostgreSQL's own rule (``ReplicationSlotValidateName``):
lower-case letters, digits and underscores, 1 to 63 characters; a name that
breaks it is refused here with exit 2 before any SQL runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg2 import sql

from pgpoll.errors import ConfigError

NAMEDATALEN = 64
_SLOT = re.compile(r"^[a-z0-9_]+$")


def check_slot_name(name: str) -> str:
    """Return ``name`` if PostgreSQL accepts it as a replication slot name."""
    if not name:
        raise ConfigError("slot name is empty", "give a name of lower-case letters, digits and underscores")
    if len(name.encode()) >= NAMEDATALEN:
        raise ConfigError(
            f"slot name {name!r} is longer than {NAMEDATALEN - 1} bytes",
            "use a name of at most 63 lower-case letters, digits and underscores",
        )
    if not _SLOT.match(name):
        raise ConfigError(
            f"slot name {name!r} is not allowed",
            "slot names may contain only lower-case letters, digits and underscores",
        )
    return name


def check_identifier(name: str, what: str = "name") -> str:
    """Return ``name`` if it can be an SQL identifier (non-empty, no NUL, < 64 bytes)."""
    if not name or "\x00" in name:
        raise ConfigError(f"{what} {name!r} is empty or holds a NUL byte", f"give a valid {what}")
    if len(name.encode()) >= NAMEDATALEN:
        raise ConfigError(
            f"{what} {name!r} is longer than {NAMEDATALEN - 1} bytes",
            "PostgreSQL truncates such names; use a shorter one",
        )
    return name


@dataclass(frozen=True)
class QualifiedName:
    """``schema.table`` as two separate identifiers (no quoting inside)."""

    schema: str
    table: str

    def sql(self) -> sql.Composed:
        """The quoted ``"schema"."table"`` for SQL text."""
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.table))

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.table)}"


_PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")


def quote_ident(name: str) -> str:
    """Quote like PostgreSQL's ``quote_identifier`` (only when needed; keywords not checked)."""
    if _PLAIN.match(name):
        return name
    return double_quote(name)


def double_quote(name: str) -> str:
    """Always double-quote ``name`` (``"`` inside doubled): for lists the server splits as identifiers."""
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: str) -> str:
    """``value`` as a standard SQL string literal (``'`` doubled), for statements that take no parameters (COPY).

    Correct only with ``standard_conforming_strings`` on, which every reading
    transaction pins first (:mod:`pgpoll.source.session`). A NUL byte cannot
    be in a PostgreSQL string at all: refused.
    """
    if "\0" in value:
        raise ValueError("a NUL character cannot be sent to PostgreSQL")
    return "'" + value.replace("'", "''") + "'"


# PostgreSQL's lexer (scan.l): ident_start [A-Za-z\200-\377_], ident_cont adds [0-9$].
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BARE_WORD = re.compile(r"[A-Za-z_\u0080-\U0010FFFF][A-Za-z0-9_$\u0080-\U0010FFFF]*")


def fold_case(word: str) -> str:
    """Fold an unquoted identifier like PostgreSQL does in UTF-8: ASCII ``A-Z`` only."""
    return word.translate(_ASCII_LOWER)


def _read_ident(text: str, pos: int) -> tuple[str, int]:
    """Read one identifier at ``pos``: a double-quoted name (``""`` inside is one quote) or a bare word.

    A bare word follows PostgreSQL's rule (a letter or ``_``, then letters, digits,
    ``_`` or ``$``) and folds ASCII upper case to lower case, as the server does;
    anything else must be double-quoted.
    """
    if pos < len(text) and text[pos] == '"':
        out = []
        i = pos + 1
        while True:
            j = text.find('"', i)
            if j < 0:
                raise ConfigError(f"unterminated quoted name in {text!r}", 'close every " (write "" for a quote inside a name)')
            out.append(text[i:j])
            if j + 1 < len(text) and text[j + 1] == '"':
                out.append('"')
                i = j + 2
                continue
            return "".join(out), j + 1
    m = _BARE_WORD.match(text, pos)
    if not m:
        found = repr(text[pos]) if pos < len(text) else "the end"
        raise ConfigError(
            f"expected a name at position {pos} in {text!r}, found {found}",
            'write schema.table; double-quote names with other characters than letters, digits, _ and $, e.g. "my table"',
        )
    return fold_case(m.group(0)), m.end()


def parse_qualified_name(text: str, default_schema: str = "public") -> tuple[QualifiedName, int]:
    """Parse ``schema.table`` (either part may be double-quoted) from the start of ``text``.

    Returns the name and the position after it. Unquoted parts fold to lower case.
    """
    pos = len(text) - len(text.lstrip())
    first, pos = _read_ident(text, pos)
    if pos < len(text) and text[pos] == ".":
        second, pos = _read_ident(text, pos + 1)
        name = QualifiedName(check_identifier(first, "schema"), check_identifier(second, "table"))
    else:
        name = QualifiedName(default_schema, check_identifier(first, "table"))
    return name, pos


def parse_column_list(text: str, pos: int = 0) -> tuple[list[str], int]:
    """Parse ``(a, "B c", d)`` starting at the ``(`` at ``pos``; returns the names and the position after ``)``."""
    if pos >= len(text) or text[pos] != "(":
        raise ConfigError(f"expected '(' at position {pos} in {text!r}", "write a column list as (col1, col2)")
    cols: list[str] = []
    pos += 1
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        col, pos = _read_ident(text, pos)
        cols.append(check_identifier(col, "column"))
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            raise ConfigError(f"unclosed column list in {text!r}", "close the list with )")
        if text[pos] == ")":
            return cols, pos + 1
        if text[pos] != ",":
            raise ConfigError(f"unexpected {text[pos]!r} in column list of {text!r}", "separate columns with commas")
        pos += 1
