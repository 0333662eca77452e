"""The ``--row-filter`` tokenizer: spec text to tokens, refusing every character outside the subset.

Split from :mod:`pgpoll.rowfilter.expression` (the parser) so each reads on its own: this module knows
characters (quotes, numbers, identifiers, PostgreSQL's operator-lexing rule), the parser knows grammar.
Every refusal is a :class:`~pgpoll.errors.ConfigError` that names the offset in the spec.
"""

from __future__ import annotations

import re

from pgpoll.errors import ConfigError

__all__ = ["FIX_SUBSET", "Token", "refuse", "tokenize"]

_OP_CHARS = "+-*/<>=~!@#%^&|`?"
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_IDENT_TAIL = re.compile(r"[A-Za-z0-9_\u0080-\U0010ffff]*")

Token = tuple[str, str, int]  # (kind, value, offset); kinds: ident qident num str op punct end


#: The fix hint of every refusal of something outside the subset.
FIX_SUBSET = ("use only columns, constants, comparisons (= <> < <= > >=), AND/OR/NOT, IS [NOT] NULL, "
              "IS [NOT] TRUE/FALSE, [NOT] IN (...), [NOT] BETWEEN and 'literal'::type")


def refuse(what: str, fix: str, spec: str, pos: int) -> ConfigError:
    """The error for something in ``spec`` at offset ``pos`` that pgpoll does not accept."""
    return ConfigError(f"row filter {spec!r}: {what} (at offset {pos})", fix)


def _quoted(text: str, i: int, spec: str, base: int) -> tuple[str, int]:
    """The body of the '...' or "..." starting at ``i`` (doubled quotes undone) and the offset after it."""
    quote, j, parts = text[i], i + 1, []
    while True:
        k = text.find(quote, j)
        if k < 0:
            what = "string constant" if quote == "'" else "quoted identifier"
            raise refuse(f"unterminated {what}", f"close it with {quote}", spec, base + i)
        parts.append(text[j:k])
        if not text.startswith(quote * 2, k):
            return "".join(parts), k + 1
        parts.append(quote)
        j = k + 2


def tokenize(text: str, spec: str, base: int) -> list[Token]:
    """Split ``text`` into tokens; refuse every character outside the subset."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        at = base + i
        if c.isspace():
            i += 1
        elif c == "\x00":
            raise refuse("NUL character", "remove it", spec, at)
        elif c == "\\":
            raise refuse("backslash", "write characters as themselves inside '...' (no escapes)", spec, at)
        elif c == ";":
            raise refuse("';' is not allowed", "give one expression, without ';'", spec, at)
        elif c == "$":
            raise refuse("'$' (parameters, dollar quoting) is not allowed", "use '...' string constants", spec, at)
        elif text.startswith("--", i) or text.startswith("/*", i):
            raise refuse("comments are not allowed", "remove the comment", spec, at)
        elif c in "'\"":
            value, i = _quoted(text, i, spec, base)
            if c == "'" and "\\" in value:
                raise refuse("backslash", "write characters as themselves inside '...' (no escapes)", spec, at)
            if c == '"' and not value:
                raise refuse("zero-length quoted identifier", 'give a name between the "..."', spec, at)
            out.append(("str" if c == "'" else "qident", value, at))
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m is not None
            i = m.end()
            if i < n and (text[i].isalnum() or text[i] in "_.'\""):
                raise refuse(f"trailing junk after numeric constant {text[m.start():i + 1]!r}",
                              "write plain decimal numbers (no 0x, no _ separators)", spec, at)
            out.append(("num", m.group(), at))
        elif c.isalpha() or c == "_":
            m = _IDENT_TAIL.match(text, i + 1)
            assert m is not None
            word = text[i:m.end()]
            i = m.end()
            if i < n and text[i] == "'":
                raise refuse(f"prefixed string {word}'...' is not allowed",
                              "use a plain '...' string (no E'', U&'', B'', X'', or type 'literal' forms)", spec, at)
            out.append(("ident", "".join(ch.lower() if "A" <= ch <= "Z" else ch for ch in word), at))
        elif c in _OP_CHARS:
            j = i
            while j < n and text[j] in _OP_CHARS and not text.startswith("--", j) and not text.startswith("/*", j):
                j += 1
            op = text[i:j]
            # PostgreSQL's lexer: a multi-char operator ends in + or - only if it holds one of ~!@#%^&|`?
            while len(op) > 1 and op[-1] in "+-" and not any(ch in "~!@#%^&|`?" for ch in op):
                op = op[:-1]
            out.append(("op", op, at))
            i += len(op)
        elif text.startswith("::", i):
            out.append(("punct", "::", at))
            i += 2
        elif c in "(),.:":
            out.append(("punct", c, at))
            i += 1
        else:
            raise refuse(f"character {c!r} is not allowed", FIX_SUBSET, spec, at)
    out.append(("end", "", base + n))
    return out
