"""Evaluate row filters on a change's text values, with PostgreSQL's UPDATE transformation.

Follows ``pgoutput_row_filter`` (``src/backend/replication/pgoutput/pgoutput.c``):

* INSERT is kept if the new row matches, DELETE if the old row matches; a
  DELETE without an old row (REPLICA IDENTITY NOTHING) is dropped, as pgoutput
  drops it.
* UPDATE with an old row: both match -> UPDATE; only the old row -> DELETE
  (of the old row); only the new row -> INSERT (of the new row); neither ->
  dropped. Columns missing from the new row (unchanged TOAST) are taken from
  the old row for the evaluation and for the INSERT, as pgoutput's
  ``tmp_new_slot`` does.
* UPDATE without an old row (key unchanged, REPLICA IDENTITY DEFAULT/INDEX):
  pgoutput evaluates the new row only: match -> UPDATE, else dropped. Since
  the filter may only use key columns (checked at start-up), this is the same
  as taking the old key from the new row.
* A filter that evaluates to NULL does not match; several filters on one
  table are ORed (``make_orclause``); TRUNCATE is never filtered.

Comparisons follow the column's type (the test_decoding type name):

* ``smallint``/``integer``/``bigint``, ``numeric``, ``real``, ``double
  precision``: numeric comparison as PostgreSQL resolves the operator (a
  float on either side compares as ``float8``, with a ``real`` value rounded
  to single precision; else ``numeric`` if on either side; else integer).
  ``NaN`` equals ``NaN`` and is greater than every other value.
* ``boolean``: ``false < true``.
* ``text``, ``character varying``, ``name``, ``character(n)`` (trailing
  spaces ignored, as ``bpchar`` does): Python string comparison. PostgreSQL
  compares with the database collation: ``=`` and ``<>`` always agree (every
  deterministic collation compares equality bytewise); ``<``/``>`` agree only
  under the ``C`` collation (code-point order).
* ``date``, ``timestamp``, ``timestamp with time zone``: ISO text is parsed to
  comparable integers (``infinity`` and BC dates included); a
  ``timestamptz`` constant without an offset is read as UTC.
* any other type: ``=``/``<>``/``IN``/``IS DISTINCT FROM`` against a string
  constant, comparing the exact text; the constant must be written as
  PostgreSQL prints the value. Ordering is refused.

A string constant takes the type of the column it is compared with (it is
checked against that type when the filter is compiled, as PostgreSQL checks
it at CREATE PUBLICATION). Type errors raise :class:`ConfigError` at
compile time: :meth:`TableFilters.check_types` at start-up.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from pgpoll.errors import ConfigError
from pgpoll.rowfilter.expression import RowFilter
from pgpoll.rowfilter.nodes import Between, BoolOp, BoolTest, ColumnRef, Compare, Const, Distinct, Expr, InList, Not, NullTest
from pgpoll.rowfilter.operands import family_of, key, num_key

__all__ = ["TableFilters", "compile_filter"]

Row = Mapping[str, str | None]
Pred = Callable[[Row], bool | None]
_NUMERIC = ("int", "numeric", "float4", "float8")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
# ---- compiling ---------------------------------------------------------------------------


class _Operand:
    """One side of a comparison: its family and how to read its raw value from a row."""

    __slots__ = ("const", "family", "read", "type_name")

    def __init__(self, family: str, type_name: str, read: Callable[[Row], Any], const: Const | None = None) -> None:
        self.family, self.type_name, self.read, self.const = family, type_name, read, const


class _Compiler:
    def __init__(self, types: Mapping[str, str], where: str) -> None:
        self.types = types
        self.where = where

    def fail(self, what: str, fix: str) -> ConfigError:
        return ConfigError(f"{self.where}: {what}", fix)

    def operand(self, node: Expr) -> _Operand:
        if isinstance(node, ColumnRef):
            name = node.name
            type_name = self.types.get(name)
            if type_name is None:  # not in this change (a key-only old row): always NULL
                return _Operand("absent", "", lambda row: None)
            return _Operand(family_of(type_name), type_name, lambda row: row.get(name))
        if isinstance(node, Const):
            if node.kind == "null":
                return _Operand("null", "", lambda row: None, node)
            if node.cast is not None:
                family = family_of(node.cast)
                self.literal_key(family, node.cast, node)
                return _Operand(family, node.cast, lambda row: node.text, Const("string", node.text, node.cast))
            family = {"int": "int", "numeric": "numeric", "bool": "bool", "string": "unknown"}[node.kind]
            if family == "int" and not -(1 << 63) <= int(node.text or 0) < (1 << 63):
                family = "numeric"
            return _Operand(family, f"{node.kind} constant", lambda row: node.text, node)
        pred = self.predicate(node)
        return _Operand("bool", "boolean", lambda row: pred(row))

    def literal_key(self, family: str, type_name: str, const: Const) -> Any:
        try:
            return key(family, type_name, const.text or "", const.kind == "string")
        except (ValueError, InvalidOperation, OverflowError) as exc:
            raise self.fail(f"{const.text!r} is not a valid {type_name} ({exc})",
                            f"write the constant as a {type_name} value, e.g. ISO dates '2024-01-31'") from None

    def domain(self, left: _Operand, right: _Operand, op: str) -> tuple[str, str, str] | None:
        """(domain, left type, right type) for comparing ``left`` and ``right``; None: always NULL."""
        lf, rf = left.family, right.family
        if "null" in (lf, rf) or "absent" in (lf, rf):
            return None
        if lf == rf == "unknown":
            return ("text", "text", "text")
        if lf == "unknown" or rf == "unknown":
            known = right if lf == "unknown" else left
            dom = known.family
            if dom == "other" and op not in ("=", "<>"):
                raise self.fail(f"ordering ({op}) on type {known.type_name} is not supported",
                                "compare it with = or <> (exact text), or filter on another column")
            return (dom, known.type_name, known.type_name)
        if lf in _NUMERIC and rf in _NUMERIC:
            dom = "float" if {"float4", "float8"} & {lf, rf} else "numeric" if "numeric" in (lf, rf) else "int"
            return (dom, left.type_name, right.type_name)
        if {lf, rf} <= {"text", "bpchar"}:
            return ("text", left.type_name, right.type_name)
        if lf == rf and lf in ("bool", "date", "timestamp", "timestamptz"):
            return (lf, left.type_name, right.type_name)
        raise self.fail(f"cannot compare {left.type_name or lf} with {right.type_name or rf}",
                        "compare a column with a constant of its kind (numbers, text, booleans, dates, timestamps; "
                        "other types: = or <> with a '...' constant)")

    def comparison(self, op: str, left_node: Expr, right_node: Expr) -> Callable[[Row], tuple[Any, Any]] | None:
        """A function row -> (left key, right key), keys None for NULL; None when always NULL."""
        left, right = self.operand(left_node), self.operand(right_node)
        resolved = self.domain(left, right, op)
        if resolved is None:
            return None
        dom, ltype, rtype = resolved
        readers: list[Callable[[Row], Any]] = []
        for side, type_name in ((left, ltype), (right, rtype)):
            fam = dom if side.family == "unknown" else side.family
            convert = _converter(fam, dom, type_name)
            if side.const is not None:
                own = self.literal_key(fam, type_name, side.const)  # checks the constant against its type
                fixed = own if fam == dom else convert((side.const.text or "").strip())

                def fixed_key(row: Row, fixed: Any = fixed) -> Any:
                    return fixed
                readers.append(fixed_key)
            else:
                def read_key(row: Row, read: Callable[[Row], Any] = side.read, convert: Callable[[Any], Any] = convert) -> Any:
                    return None if (raw := read(row)) is None else convert(raw)
                readers.append(read_key)
        lread, rread = readers
        return lambda row: (lread(row), rread(row))

    def predicate(self, node: Expr) -> Pred:
        if isinstance(node, Compare):
            keys = self.comparison(node.op, node.left, node.right)
            if keys is None:
                return lambda row: None
            test = _OPS[node.op]
            return lambda row: None if None in (vals := keys(row)) else test(vals[0], vals[1])
        if isinstance(node, BoolOp):
            preds = [self.predicate(arg) for arg in node.args]
            stop = node.op == "OR"

            def combine(row: Row) -> bool | None:
                unknown = False
                for pred in preds:
                    value = pred(row)
                    if value is stop:
                        return stop
                    unknown = unknown or value is None
                return None if unknown else not stop
            return combine
        if isinstance(node, Not):
            inner = self.predicate(node.arg)
            return lambda row: None if (value := inner(row)) is None else not value
        if isinstance(node, NullTest):
            arg = self.operand(node.arg)
            return lambda row: (arg.read(row) is None) != node.negated
        if isinstance(node, BoolTest):
            bool_pred = self.predicate(node.arg)
            return lambda row: (bool_pred(row) is node.value) != node.negated
        if isinstance(node, Distinct):
            pair = self.comparison("=", node.left, node.right)
            left, right = self.operand(node.left), self.operand(node.right)

            def distinct(row: Row) -> bool:
                lnull, rnull = left.read(row) is None, right.read(row) is None
                if lnull or rnull:
                    return (lnull != rnull) != node.negated
                assert pair is not None
                a, b = pair(row)
                different: bool = a != b
                return different != node.negated
            return distinct
        if isinstance(node, InList):
            op, join = ("<>", "AND") if node.negated else ("=", "OR")
            return self.predicate(BoolOp(join, tuple(Compare(op, node.arg, item) for item in node.items)))
        if isinstance(node, Between):
            if node.negated:
                return self.predicate(BoolOp("OR", (Compare("<", node.arg, node.low), Compare(">", node.arg, node.high))))
            return self.predicate(BoolOp("AND", (Compare(">=", node.arg, node.low), Compare("<=", node.arg, node.high))))
        # a bare column or constant used as a condition
        operand = self.operand(node)
        if operand.family in ("null", "absent"):
            return lambda row: None
        if operand.family != "bool":
            raise self.fail(f"{_describe(node)} is not a boolean condition",
                            "compare it with something, e.g. (col > 0), or use a boolean column")
        if operand.const is not None:
            value = operand.const.text == "true"
            return lambda row: value
        read = operand.read
        return lambda row: None if (raw := read(row)) is None else (raw if isinstance(raw, bool) else raw in ("true", "t"))


def _converter(fam: str, dom: str, type_name: str) -> Callable[[Any], Any]:
    """Raw value of family ``fam`` -> comparable key in domain ``dom``."""
    if dom == "float" and fam in ("int", "numeric"):
        return lambda text: num_key(float(text))
    if dom == "numeric" and fam == "int":
        return lambda text: num_key(Decimal(text))
    if fam == "bool":
        return lambda value: value if isinstance(value, bool) else value in ("true", "t")
    return lambda text: key(fam, type_name, text, False)


def _describe(node: Expr) -> str:
    if isinstance(node, ColumnRef):
        return f"column {node.name}"
    return f"constant {node.text!r}" if isinstance(node, Const) else type(node).__name__


def compile_filter(row_filter: RowFilter, types: Mapping[str, str]) -> Pred:
    """A function row -> True/False/None (NULL) for ``row_filter`` under the column ``types``."""
    where = f"row filter on {row_filter.schema}.{row_filter.table} {row_filter.text}"
    return _Compiler(types, where).predicate(row_filter.expression)


class TableFilters:
    """All ``--row-filter`` filters, grouped by table; applies them to changes."""

    def __init__(self, filters: Sequence[RowFilter]) -> None:
        self._by_table: dict[tuple[str, str], list[RowFilter]] = {}
        for row_filter in filters:
            self._by_table.setdefault((row_filter.schema, row_filter.table), []).append(row_filter)
        self._compiled: dict[tuple[str, str, tuple[str | None, ...]], Callable[[Row], bool]] = {}
        self._columns = {key: sorted(set().union(*(f.columns() for f in fs))) for key, fs in self._by_table.items()}

    def tables(self) -> list[tuple[str, str]]:
        """The filtered tables, as (schema, table)."""
        return list(self._by_table)

    def filters_for(self, schema: str, table: str) -> tuple[RowFilter, ...]:
        """The filters on one table (ORed)."""
        return tuple(self._by_table.get((schema, table), ()))

    def applies_to(self, schema: str, table: str) -> bool:
        """True when at least one filter names this table."""
        return (schema, table) in self._by_table

    def check_types(self, schema: str, table: str, types: Mapping[str, str]) -> None:
        """Compile the table's filters for ``types``; raises :class:`ConfigError` on a type error."""
        self._matcher(schema, table, types)

    def _matcher(self, schema: str, table: str, types: Mapping[str, str]) -> Callable[[Row], bool]:
        cache_key = (schema, table, tuple(types.get(c) for c in self._columns[(schema, table)]))
        matcher = self._compiled.get(cache_key)
        if matcher is None:
            preds = [compile_filter(f, types) for f in self._by_table[(schema, table)]]
            matcher = lambda row: any(pred(row) is True for pred in preds)  # noqa: E731 - NULL is no match
            if len(self._compiled) > 1024:
                self._compiled.clear()
            self._compiled[cache_key] = matcher
        return matcher

    def transform(
        self,
        op: str,
        schema: str,
        table: str,
        before: Mapping[str, str | None] | None,
        after: Mapping[str, str | None] | None,
        types: Mapping[str, str],
    ) -> tuple[str, Mapping[str, str | None] | None, Mapping[str, str | None] | None] | None:
        """The change to emit as ``(op, before, after)``, or None to drop it (see the module docstring).

        Filters on non-key columns are refused at start-up unless the
        identity is FULL, so the old row's filtered columns are always known.
        """
        op = str(getattr(op, "value", op))
        if op not in ("I", "U", "D") or not self.applies_to(schema, table):
            return (op, before, after)
        matches = self._matcher(schema, table, types)
        if op == "I":
            return (op, before, after) if after is not None and matches(after) else None
        if op == "D":
            return (op, before, after) if before is not None and matches(before) else None
        if after is None:  # (no-tuple-data): nothing to evaluate
            return None
        if before is None:
            return (op, before, after) if matches(after) else None
        missing = {k: v for k, v in before.items() if k not in after and v is not None}
        new_row = {**after, **missing} if missing else after
        old_match, new_match = matches(before), matches(new_row)
        if old_match and new_match:
            return (op, before, after)
        if old_match:
            return ("D", before, None)
        if new_match:
            return ("I", None, new_row)
        return None
