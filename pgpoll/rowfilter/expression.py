"""Tokenizer and parser for ``--row-filter`` specs: text in, a frozen-dataclass AST out.

A spec is ``schema.tbl: (expr)`` or ``tbl: (expr)`` (schema ``public``). Plain
names are lower-cased (ASCII ``A-Z`` only, as PostgreSQL's
``downcase_identifier`` does in UTF-8); double-quoted ones are taken as written,
``""`` standing for ``"``. The expression must be in parentheses, as
PostgreSQL requires for a publication's ``WHERE (...)``. The grammar is the
subset of PostgreSQL's row filter expressions that can be evaluated on a
change's text values, with PostgreSQL's precedence::

    expr    := and ("OR" and)*
    and     := not ("AND" not)*
    not     := "NOT" not | is
    is      := cmp ("IS" ["NOT"] ("NULL" | "TRUE" | "FALSE" | "UNKNOWN"
                              | "DISTINCT" "FROM" cmp) | "ISNULL" | "NOTNULL")*
    cmp     := pred [("=" | "<>" | "!=" | "<" | "<=" | ">" | ">=") pred]
    pred    := primary ["NOT"] ("IN" "(" primary ("," primary)* ")"
                               | "BETWEEN" primary "AND" primary)
    primary := column | constant ["::" type] | "(" expr ")"
    constant:= ["+" | "-"] number | 'string' | TRUE | FALSE | NULL

Everything else raises :class:`~pgpoll.errors.ConfigError` naming what is not
allowed: function calls, subqueries, arithmetic and every other operator
(``||``, ``LIKE``, ``~``...), ``CASE``/``CAST``/``ARRAY``, qualified or system
columns, ``;``, comments, ``$`` (parameters, dollar quotes), prefixed strings
(``E''``, ``U&''``, ``B''``, ``X''``), backslashes anywhere (so the meaning never
depends on ``standard_conforming_strings``), NUL, casts of columns, type
modifiers. Nothing is passed to ``eval``/``exec`` or to a server.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgpoll.errors import ConfigError
from pgpoll.rowfilter.nodes import (
    Between,
    BoolOp,
    BoolTest,
    ColumnRef,
    Compare,
    Const,
    Distinct,
    Expr,
    InList,
    Not,
    NullTest,
    columns_of,
)
from pgpoll.rowfilter.tokens import FIX_SUBSET, Token, refuse, tokenize

__all__ = [
    "SYSTEM_COLUMNS",
    "Between",
    "BoolOp",
    "BoolTest",
    "ColumnRef",
    "Compare",
    "Const",
    "Distinct",
    "Expr",
    "InList",
    "Not",
    "NullTest",
    "RowFilter",
    "parse_row_filter",
]

#: PostgreSQL's system columns; PostgreSQL refuses them in row filters.
SYSTEM_COLUMNS = frozenset({"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid", "oid"})

# Reserved words (and type/func-name keywords) that cannot be a bare column name here.
_RESERVED = frozenset([
    "all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric", "authorization", "between",
    "binary", "both", "case", "cast", "check", "collate", "collation", "column", "concurrently", "constraint",
    "create", "cross", "current_catalog", "current_date", "current_role", "current_schema", "current_time",
    "current_timestamp", "current_user", "default", "deferrable", "desc", "distinct", "do", "else", "end", "except",
    "exists", "false", "fetch", "for", "foreign", "freeze", "from", "full", "grant", "group", "having", "ilike", "in",
    "initially", "inner", "intersect", "into", "is", "isnull", "join", "lateral", "leading", "left", "like", "limit",
    "localtime", "localtimestamp", "natural", "not", "notnull", "null", "offset", "on", "only", "or", "order",
    "outer", "overlaps", "placing", "primary", "references", "returning", "right", "select", "session_user",
    "similar", "some", "symmetric", "system_user", "table", "tablesample", "then", "to", "trailing", "true", "union",
    "unique", "unknown", "user", "using", "values", "variadic", "verbose", "when", "where", "window", "with",
])
_SUBQUERY_WORDS = frozenset({"select", "with", "values", "table", "exists"})
_COMPARISON = {"=": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_TYPES = {tuple(alias.split()): name for name, aliases in (
    ("smallint", "smallint|int2"), ("integer", "integer|int|int4"), ("bigint", "bigint|int8"),
    ("numeric", "numeric|decimal"), ("real", "real|float4"), ("double precision", "double precision|float8"),
    ("text", "text"), ("character varying", "varchar|character varying"), ("boolean", "boolean|bool"),
    ("date", "date"), ("timestamp without time zone", "timestamp|timestamp without time zone"),
    ("timestamp with time zone", "timestamptz|timestamp with time zone"),
) for alias in aliases.split("|")}
class _Parser:
    """Recursive descent over the token list (one instance per expression)."""

    def __init__(self, tokens: list[Token], spec: str) -> None:
        self.toks = tokens
        self.pos = 0
        self.spec = spec

    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def take(self) -> Token:
        self.pos += 1
        return self.toks[self.pos - 1]

    def accept(self, kind: str, *values: str) -> bool:
        tok = self.peek()
        if tok[0] == kind and tok[1] in values:
            self.pos += 1
        return tok[0] == kind and tok[1] in values

    def word(self, *words: str) -> bool:
        return self.accept("ident", *words)

    def punct(self, p: str) -> bool:
        return self.accept("punct", p)

    def fail(self, what: str, fix: str = FIX_SUBSET, tok: Token | None = None) -> ConfigError:
        tok = tok or self.peek()
        return refuse(what, fix, self.spec, tok[2])

    def expect_punct(self, p: str) -> None:
        if not self.punct(p):
            raise self.fail(f"expected {p!r}, found {self._show(self.peek())}", "check the parentheses and commas")

    @staticmethod
    def _show(tok: Token) -> str:
        return "end of expression" if tok[0] == "end" else repr(tok[1])

    def expression(self) -> Expr:
        args = [self.and_()]
        while self.word("or"):
            args.append(self.and_())
        return args[0] if len(args) == 1 else BoolOp("OR", tuple(args))

    def and_(self) -> Expr:
        args = [self.not_()]
        while self.word("and"):
            args.append(self.not_())
        return args[0] if len(args) == 1 else BoolOp("AND", tuple(args))

    def not_(self) -> Expr:
        if self.word("not"):
            return Not(self.not_())
        return self.is_()

    def is_(self) -> Expr:
        node = self.cmp()
        while True:
            if self.word("isnull"):
                node = NullTest(node, False)
            elif self.word("notnull"):
                node = NullTest(node, True)
            elif self.word("is"):
                negated = self.word("not")
                if self.word("null"):
                    node = NullTest(node, negated)
                elif self.word("true", "false", "unknown"):
                    value = self.toks[self.pos - 1][1]
                    node = BoolTest(node, None if value == "unknown" else value == "true", negated)
                elif self.word("distinct"):
                    if not self.word("from"):
                        raise self.fail("expected FROM after IS DISTINCT", "write IS [NOT] DISTINCT FROM value")
                    node = Distinct(node, self.cmp(), negated)
                else:
                    raise self.fail(f"IS {'NOT ' if negated else ''}{self._show(self.peek())} is not supported",
                                    "use IS [NOT] NULL, IS [NOT] TRUE/FALSE/UNKNOWN or IS [NOT] DISTINCT FROM")
            else:
                return node

    def cmp(self) -> Expr:
        left = self.pred()
        kind, value, _ = self.peek()
        if kind == "op":
            if value not in _COMPARISON:
                raise self.fail(f"operator {value!r} is not allowed")
            self.take()
            right = self.pred()
            nxt = self.peek()
            if nxt[0] == "op" and nxt[1] in _COMPARISON:
                raise self.fail("comparisons cannot be chained", "join them with AND", nxt)
            return Compare(_COMPARISON[value], left, right)
        return left

    def pred(self) -> Expr:
        node = self.primary()
        negated = False
        if self.peek()[0] == "ident" and self.peek()[1] == "not" and self.peek(1)[:2] in (("ident", "in"), ("ident", "between")):
            self.take()
            negated = True
        if self.word("in"):
            self.expect_punct("(")
            items = [self.primary()]
            while self.punct(","):
                items.append(self.primary())
            self.expect_punct(")")
            return InList(node, tuple(items), negated)
        if self.word("between"):
            if self.peek()[1] in ("symmetric", "asymmetric") and self.peek()[0] == "ident":
                raise self.fail("BETWEEN SYMMETRIC is not supported", "write BETWEEN low AND high")
            low = self.primary()
            if not self.word("and"):
                raise self.fail("expected AND in BETWEEN", "write x BETWEEN low AND high")
            return Between(node, low, self.primary(), negated)
        if self.word("like", "ilike", "similar"):
            raise self.fail(f"{self.toks[self.pos - 1][1].upper()} is not allowed", FIX_SUBSET, self.toks[self.pos - 1])
        return node

    def primary(self) -> Expr:
        tok = self.take()
        kind, value, _ = tok
        if kind == "punct" and value == "(":
            if self.peek()[0] == "ident" and self.peek()[1] in _SUBQUERY_WORDS:
                raise self.fail("subqueries are not allowed", FIX_SUBSET)
            node = self.expression()
            self.expect_punct(")")
            return self._no_cast(node)
        if kind == "op" and value in ("+", "-") and self.peek()[0] == "num":
            num = self.take()[1]
            return self._cast(self._number(("-" if value == "-" else "") + num))
        if kind == "op":
            raise self.fail(f"operator {value!r} is not allowed", FIX_SUBSET, tok)
        if kind == "num":
            return self._cast(self._number(value))
        if kind == "str":
            return self._cast(Const("string", value))
        if kind in ("ident", "qident"):
            if self.peek()[:2] == ("punct", "("):
                raise self.fail(f"function call {value}(...) is not allowed", FIX_SUBSET, tok)
            if self.peek()[:2] == ("punct", "."):
                raise self.fail("qualified names (x.y) are not allowed", "name the column alone", tok)
            if kind == "ident":
                if value in ("true", "false"):
                    return self._cast(Const("bool", value))
                if value == "null":
                    return self._cast(Const("null", None))
                if value in _SUBQUERY_WORDS:
                    raise self.fail("subqueries are not allowed", FIX_SUBSET, tok)
                if value in _RESERVED:
                    raise self.fail(f"{value.upper()} is not allowed here",
                                    f'{FIX_SUBSET} (quote a column named {value} as "{value}")', tok)
            if value in SYSTEM_COLUMNS:
                raise self.fail(f"system column {value} is not allowed", "filter on the table's own columns", tok)
            return self._no_cast(ColumnRef(value))
        raise self.fail(f"expected a column or a constant, found {self._show(tok)}", FIX_SUBSET, tok)

    def _number(self, text: str) -> Const:
        plain = text.lstrip("-")
        return Const("int" if plain.isdigit() else "numeric", text)

    def _no_cast(self, node: Expr) -> Expr:
        if self.peek()[:2] == ("punct", "::"):
            raise self.fail("casts are allowed on constants only", "compare the column with 'literal'::type")
        return node

    def _cast(self, node: Const) -> Expr:
        if not self.punct("::"):
            return node
        words: list[str] = []
        for tok in self.toks[self.pos:self.pos + 4]:
            if tok[0] != "ident":
                break
            words.append(tok[1])
        size = next((k for k in range(len(words), 0, -1) if tuple(words[:k]) in _TYPES), 0)
        name = _TYPES.get(tuple(words[:size]))
        self.pos += size
        if name is None or self.peek()[:2] in (("punct", "("), ("punct", "."), ("punct", "::")):
            shown = " ".join(words[:1]) or self._show(self.peek())
            raise self.fail(f"cast to {shown} is not supported",
                            "cast to one of: " + ", ".join(sorted(set(_TYPES.values()))) + " (no type modifiers)")
        return Const(node.kind, node.text, name)


@dataclass(frozen=True)
class RowFilter:
    """One ``--row-filter``: the table it applies to and its parsed expression.

    ``text`` is the expression as given (with its parentheses).
    """

    schema: str
    table: str
    expression: Expr
    text: str

    def columns(self) -> frozenset[str]:
        """The names of the columns the expression reads."""
        return columns_of(self.expression)


_SPEC_FIX = "write --row-filter 'schema.tbl: (expr)' (or 'tbl: (expr)'; quote names with \"...\")"


def parse_row_filter(spec: str) -> RowFilter:
    """Parse ``schema.tbl: (expr)`` / ``tbl: (expr)`` into a :class:`RowFilter`.

    Raises :class:`ConfigError` for anything outside the supported subset.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"row filter must be text, not {type(spec).__name__}", _SPEC_FIX)
    toks = tokenize(spec, spec, 0)
    parser = _Parser(toks, spec)
    names: list[str] = []
    while parser.peek()[0] in ("ident", "qident") and len(names) < 2:
        names.append(parser.take()[1])
        if not parser.punct("."):
            break
    if not names or toks[parser.pos - 1][1] == "." or not parser.punct(":"):
        raise ConfigError(f"row filter {spec!r}: expected a table name and ':' before the expression", _SPEC_FIX)
    schema, table = ("public", names[0]) if len(names) == 1 else (names[0], names[1])
    for name in (schema, table):
        if len(name.encode()) >= 64:
            raise ConfigError(f"row filter {spec!r}: name {name!r} is longer than 63 bytes", "use the table's real name")
    start = parser.peek()[2]
    if not parser.punct("("):
        raise ConfigError(f"row filter {spec!r}: the expression must be in parentheses", _SPEC_FIX)
    if parser.peek()[0] == "end" or parser.peek()[:2] == ("punct", ")"):
        raise parser.fail("empty expression", "write a condition such as (id > 100)")
    if parser.peek()[0] == "ident" and parser.peek()[1] in _SUBQUERY_WORDS:
        raise parser.fail("subqueries are not allowed")
    expression = parser.expression()
    parser.expect_punct(")")
    if parser.peek()[0] != "end":
        tok = parser.peek()
        raise parser.fail(f"unexpected {parser._show(tok)} after the parenthesised expression",
                          "give one expression in one pair of parentheses", tok)
    return RowFilter(schema, table, expression, spec[start:].strip())
