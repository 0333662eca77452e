"""``Lsn``: a PostgreSQL write-ahead-log position as a value type.

An LSN is an unsigned 64-bit integer. PostgreSQL prints it as two upper-case
hex halves, ``16/B374D848``; pgpoll's partition names use the 16-digit
zero-padded form, ``00000016B374D848``, so they sort in LSN order.
"""

from __future__ import annotations

import re

from pgpoll.errors import ConfigError

_MAX = (1 << 64) - 1
_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_PADDED = re.compile(r"^[0-9A-Fa-f]{16}$")


class Lsn(int):
    """A WAL position: an ``int`` that parses and prints PostgreSQL's form.

    >>> Lsn.parse("0/16B1970")
    Lsn('0/16B1970')
    >>> int(Lsn.parse("1/0"))
    4294967296
    >>> Lsn(4294967296).padded()
    '0000000100000000'
    """

    __slots__ = ()

    def __new__(cls, value: int | str = 0) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        if value < 0 or value > _MAX:
            raise ConfigError(f"LSN {value} is outside 0..2^64-1")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``X/Y`` (PostgreSQL's form) or 16 hex digits (pgpoll's padded form)."""
        text = text.strip()
        m = _TEXT.match(text)
        if m:
            return int.__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))
        if _PADDED.match(text):
            return int.__new__(cls, int(text, 16))
        raise ConfigError(
            f"{text!r} is not an LSN",
            "write it as PostgreSQL prints it, e.g. 0/16B1970",
        )

    def __str__(self) -> str:
        v = int(self)
        return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def padded(self) -> str:
        """16 upper-case hex digits, zero-padded: sorts in LSN order as text."""
        return f"{int(self):016X}"


def lsn_or_none(value: int | str | None) -> Lsn | None:
    """Convert a driver value (``'0/16B1970'``, an int or None) to ``Lsn``."""
    if value is None:
        return None
    return Lsn(value)
