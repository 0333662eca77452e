"""The row filter AST: frozen dataclasses, one per construct of the supported subset.

:mod:`pgpoll.rowfilter.expression` builds these from text;
:mod:`pgpoll.rowfilter.evaluate` compiles them for a table's column types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "Between", "BoolOp", "BoolTest", "ColumnRef", "Compare", "Const", "Distinct", "Expr",
    "InList", "Not", "NullTest", "columns_of",
]

@dataclass(frozen=True)
class ColumnRef:
    """A column of the filtered table."""

    name: str


@dataclass(frozen=True)
class Const:
    """A constant. ``kind``: ``int``, ``numeric``, ``string``, ``bool``, ``null``.

    ``text`` is the literal's value (``'it''s'`` gives ``it's``; ``-5`` gives
    ``-5``; booleans ``true``/``false``). ``cast`` is the canonical type name
    of an explicit ``::type`` (``'2024-01-01'::date``), else None.
    """

    kind: str
    text: str | None
    cast: str | None = None


@dataclass(frozen=True)
class Compare:
    """``left op right``; ``op`` is one of ``= <> < <= > >=`` (``!=`` is read as ``<>``)."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class BoolOp:
    """``AND``/``OR`` of two or more arguments."""

    op: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    """``NOT arg``."""

    arg: Expr


@dataclass(frozen=True)
class NullTest:
    """``arg IS [NOT] NULL`` (also ``ISNULL``/``NOTNULL``)."""

    arg: Expr
    negated: bool


@dataclass(frozen=True)
class BoolTest:
    """``arg IS [NOT] TRUE|FALSE|UNKNOWN``; ``value`` None stands for UNKNOWN."""

    arg: Expr
    value: bool | None
    negated: bool


@dataclass(frozen=True)
class Distinct:
    """``left IS [NOT] DISTINCT FROM right``."""

    left: Expr
    right: Expr
    negated: bool


@dataclass(frozen=True)
class InList:
    """``arg [NOT] IN (items)``."""

    arg: Expr
    items: tuple[Expr, ...]
    negated: bool


@dataclass(frozen=True)
class Between:
    """``arg [NOT] BETWEEN low AND high``."""

    arg: Expr
    low: Expr
    high: Expr
    negated: bool


Expr: TypeAlias = ColumnRef | Const | Compare | BoolOp | Not | NullTest | BoolTest | Distinct | InList | Between


def _walk(node: Expr, out: set[str]) -> None:
    if isinstance(node, ColumnRef):
        out.add(node.name)
    elif isinstance(node, Const):
        return
    elif isinstance(node, BoolOp):
        for arg in node.args:
            _walk(arg, out)
    elif isinstance(node, (Not, NullTest, BoolTest)):
        _walk(node.arg, out)
    elif isinstance(node, (Compare, Distinct)):
        _walk(node.left, out)
        _walk(node.right, out)
    elif isinstance(node, InList):
        for sub in (node.arg, *node.items):
            _walk(sub, out)
    elif isinstance(node, Between):
        for sub in (node.arg, node.low, node.high):
            _walk(sub, out)



def columns_of(node: Expr) -> frozenset[str]:
    """The names of the columns ``node`` reads."""
    out: set[str] = set()
    _walk(node, out)
    return frozenset(out)
