"""Property tests: render lines the way test_decoding.c does, decode them back.

The renderer below follows the C code (``quote_identifier``,
``quote_qualified_identifier``, ``print_literal``, ``tuple_to_stringinfo``,
``quote_literal_cstr``, ``timestamptz_to_str``, the message and truncate
callbacks) so hypothesis can search hostile names and values.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from pgpoll.changes import Column, Commit, LogicalMessage, Op, Prepare, RowChange, Truncate
from pgpoll.decode.text_decoder import TestDecodingDecoder

settings.register_profile("pgpoll", database=None, max_examples=200, deadline=None)
settings.load_profile("pgpoll")

# ---- the renderer (mirrors contrib/test_decoding/test_decoding.c) ----------------------

_SAFE_FIRST = set("abcdefghijklmnopqrstuvwxyz_")
_SAFE = _SAFE_FIRST | set("0123456789")
# A few non-unreserved keywords: quote_identifier quotes them although they are safe chars.
_KEYWORDS = {"select", "table", "from", "user", "order", "all", "null", "true", "false", "where"}
_UNQUOTED_KINDS = {"int", "float", "numeric"}


def quote_identifier(ident: str) -> str:
    safe = ident[0] in _SAFE_FIRST and all(c in _SAFE for c in ident) and ident not in _KEYWORDS
    return ident if safe else '"' + ident.replace('"', '""') + '"'


def quote_qualified_identifier(schema: str, name: str) -> str:
    return quote_identifier(schema) + "." + quote_identifier(name)


def print_literal(kind: str, text: str) -> str:
    if kind in _UNQUOTED_KINDS:
        return text
    if kind == "bit":
        return f"B'{text}'"
    if kind == "bool":
        return "true" if text == "t" else "false"
    return "'" + text.replace("'", "''") + "'"


# A column: (name, type_name, kind, text) with text None for NULL, "<toast>" for unchanged TOAST.
Col = tuple[str, str, str, str | None]
TOAST = "<toast>"


def tuple_to_stringinfo(cols: list[Col], skip_nulls: bool) -> str:
    out = []
    for name, type_name, kind, text in cols:
        if text is None and skip_nulls:
            continue
        out.append(" " + quote_identifier(name) + "[" + type_name + "]:")
        if text is None:
            out.append("null")
        elif text == TOAST:
            out.append("unchanged-toast-datum")
        else:
            out.append(print_literal(kind, text))
    return "".join(out)


def quote_literal_cstr(text: str) -> str:
    if "\\" in text:
        return "E'" + text.replace("'", "''").replace("\\", "\\\\") + "'"
    return "'" + text.replace("'", "''") + "'"


def timestamptz_to_str(ts: datetime) -> str:
    offset = ts.utcoffset() or timedelta(0)
    secs = int(offset.total_seconds())
    sign = "-" if secs < 0 else "+"
    hh, rest = divmod(abs(secs), 3600)
    mm, ss = divmod(rest, 60)
    tz = f"{sign}{hh:02d}"
    if mm or ss:
        tz += f":{mm:02d}"
    if ss:
        tz += f":{ss:02d}"
    frac = f".{ts.microsecond:06d}".rstrip("0") if ts.microsecond else ""
    return ts.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0") + frac + tz


def expected_value(kind: str, text: str) -> str:
    if kind == "bool":
        return "true" if text == "t" else "false"
    return text


# ---- strategies ---------------------------------------------------------------------------

_HOSTILE = [*list("abcxyz_09 .\"':[],;-$\n\\ÄüЖ中😀"), "new-tuple:", "old-key:", ", ", ": "]
identifiers = st.lists(
    st.sampled_from(_HOSTILE) | st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=12,
).map("".join)
builtin_types = st.sampled_from(
    [
        "integer",
        "text",
        "timestamp with time zone",
        "character varying[]",
        "bit varying",
        '"char"',
        "double precision",
        "numeric[]",
    ]
)
user_types = st.tuples(st.none() | identifiers, identifiers, st.booleans()).map(
    lambda t: (quote_identifier(t[0]) + "." if t[0] is not None else "")
    + quote_identifier(t[1])
    + ("[]" if t[2] else "")
)
any_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))


def _float_text(f: float) -> str:
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "Infinity" if f > 0 else "-Infinity"
    return repr(f)


values = st.one_of(
    st.tuples(st.just("int"), st.integers(-(2**63), 2**63 - 1).map(str)),
    st.tuples(st.just("float"), st.floats().map(_float_text)),
    st.tuples(
        st.just("numeric"),
        st.sampled_from(["NaN", "Infinity", "-Infinity"])
        | st.decimals(allow_nan=False, allow_infinity=False).map(str),
    ),
    st.tuples(st.just("bool"), st.sampled_from(["t", "f"])),
    st.tuples(st.just("bit"), st.text("01")),
    st.tuples(st.just("text"), any_text),
    st.tuples(st.just("text"), st.none()),
    st.tuples(st.just("text"), st.just(TOAST)),
)
columns = st.lists(
    st.tuples(identifiers, builtin_types | user_types, values).map(
        lambda t: (t[0], t[1], t[2][0], t[2][1])
    ),
    max_size=6,
    unique_by=lambda c: c[0],
)


def _expect(
    cols: list[Col], skip_nulls: bool
) -> tuple[tuple[Column, ...], dict[str, str | None], tuple[str, ...]]:
    shown = [c for c in cols if not (skip_nulls and c[3] is None)]
    after = {
        n: (None if t is None else expected_value(k, t)) for n, _, k, t in shown if t != TOAST
    }
    toast = tuple(n for n, _, _, t in shown if t == TOAST)
    return tuple(Column(n, ty) for n, ty, _, _ in shown), after, toast


# ---- properties -----------------------------------------------------------------------------


@given(identifiers, identifiers, columns)
def test_insert_round_trip(schema: str, table: str, cols: list[Col]) -> None:
    line = f"table {quote_qualified_identifier(schema, table)}: INSERT:" + tuple_to_stringinfo(
        cols, False
    )
    want_cols, after, toast = _expect(cols, False)
    dec = TestDecodingDecoder()
    for _ in range(2):  # the second pass goes through the cached template
        assert dec.decode(line) == RowChange(Op.INSERT, schema, table, want_cols, None, after, toast)


@given(identifiers, identifiers, columns, columns)
def test_update_with_old_key_round_trip(
    schema: str, table: str, old: list[Col], new: list[Col]
) -> None:
    old = [c for c in old if c[3] != TOAST]
    line = (
        f"table {quote_qualified_identifier(schema, table)}: UPDATE: old-key:"
        + tuple_to_stringinfo(old, True)
        + " new-tuple:"
        + tuple_to_stringinfo(new, False)
    )
    _, before, _ = _expect(old, True)
    want_cols, after, toast = _expect(new, False)
    assert TestDecodingDecoder().decode(line) == RowChange(
        Op.UPDATE, schema, table, want_cols, before, after, toast
    )


@given(identifiers, identifiers, columns)
def test_delete_round_trip(schema: str, table: str, cols: list[Col]) -> None:
    cols = [c for c in cols if c[3] != TOAST]
    line = f"table {quote_qualified_identifier(schema, table)}: DELETE:" + tuple_to_stringinfo(
        cols, True
    )
    want_cols, before, _ = _expect(cols, True)
    assert TestDecodingDecoder().decode(line) == RowChange(
        Op.DELETE, schema, table, want_cols, before, None
    )


@given(st.lists(st.tuples(identifiers, identifiers), min_size=1, max_size=4), st.booleans(), st.booleans())
def test_truncate_round_trip(rels: list[tuple[str, str]], restart: bool, cascade: bool) -> None:
    flags = (" restart_seqs" if restart else "") + (" cascade" if cascade else "") or " (no-flags)"
    line = "table " + ", ".join(quote_qualified_identifier(s, t) for s, t in rels) + ": TRUNCATE:" + flags
    assert TestDecodingDecoder().decode(line) == Truncate(
        tuple(rels), cascade=cascade, restart_identity=restart
    )


@given(st.booleans(), any_text.filter(lambda p: ", sz: " not in p), any_text)
def test_message_round_trip(transactional: bool, prefix: str, content: str) -> None:
    data = content.encode()
    line = f"message: transactional: {int(transactional)} prefix: {prefix}, sz: {len(data)} content:{content}"
    assert TestDecodingDecoder().decode(line) == LogicalMessage(transactional, prefix, data)


@given(any_text.filter(lambda g: 0 < len(g) <= 200), st.integers(0, 2**32 - 1))
def test_gid_round_trip(gid: str, xid: int) -> None:
    line = f"PREPARE TRANSACTION {quote_literal_cstr(gid)}, txid {xid}"
    assert TestDecodingDecoder().decode(line) == Prepare(xid=xid, gid=gid)


@given(
    st.datetimes(
        min_value=datetime(1, 1, 1),
        max_value=datetime(9999, 12, 30),
        timezones=st.builds(
            timezone, st.integers(-15 * 3600 + 1, 15 * 3600 - 1).map(lambda s: timedelta(seconds=s))
        ),
    ),
    st.integers(0, 2**32 - 1),
)
def test_commit_timestamp_round_trip(ts: datetime, xid: int) -> None:
    line = f"COMMIT {xid} (at {timestamptz_to_str(ts)})"
    assert TestDecodingDecoder().decode(line) == Commit(xid=xid, commit_ts=ts)
