"""Property test against a real server: both plugins decode to exactly what PostgreSQL prints.

Hypothesis makes tables with hostile identifiers and columns of many types,
fills them with random values, updates and deletes some rows; the values each
plugin's decoder produces must equal the text PostgreSQL itself prints for the
same rows — the type's output function (``format('%s', col)``, which is
``col::text`` for every type here but inet, whose cast adds the netmask),
with booleans as ``bool::text`` prints them (``true``/``false``) — read back
with ``RETURNING`` in a session with pgpoll's pinned settings.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2 import sql

from pgpoll.changes import Commit, Op, RowChange
from pgpoll.decode.decoders import make_decoder
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.slots import advance_slot, peek_options, peek_rows

# (SQL type, strategy of SQL literals for it)
_TEXTS = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
TYPES: dict[str, st.SearchStrategy[Any]] = {
    "smallint": st.integers(-32768, 32767),
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "numeric": st.one_of(st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-10**12, max_value=10**12),
                         st.sampled_from(["NaN", "Infinity", "-Infinity"])),
    "double precision": st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from(["NaN", "Infinity", "-Infinity"])),
    "real": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "text": _TEXTS,
    "character varying(40)": _TEXTS,
    "boolean": st.booleans(),
    "bytea": st.binary(max_size=20),
    "date": st.dates(),
    "timestamp without time zone": st.datetimes(),
    "timestamp with time zone": st.datetimes(timezones=st.timezones()),
    "interval": st.timedeltas(min_value=timedelta(days=-10000), max_value=timedelta(days=10000)),
    "uuid": st.uuids(),
    "jsonb": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    "integer[]": st.lists(st.one_of(st.none(), st.integers(-1000, 1000)), max_size=4),
    "text[]": st.lists(_TEXTS, max_size=3),
    "bit(4)": st.sampled_from(["0101", "1111", "0000"]),
    "inet": st.ip_addresses().map(str),
}

_IDENT_CHARS = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00")
IDENT = st.one_of(
    st.text(alphabet=_IDENT_CHARS, min_size=1, max_size=12),
    st.sampled_from(['we"ird', "has space", "dot.ted", "col:on", "br[ack]et", "MiXeD", "ünï", "--", "semi;colon"]),
).filter(lambda s: len(s.encode()) < 60 and s.strip() == s and s != "")

_counter = itertools.count()


def _literal(sql_type: str, value: Any) -> Any:
    """A parameter psycopg2 can send for ``value`` (the SQL casts it to ``sql_type``)."""
    if value is None:
        return None
    if sql_type == "jsonb":
        return json.dumps(value)
    if sql_type == "uuid":
        return str(value)
    return value


@st.composite
def workloads(draw: Any) -> tuple[list[str], list[str], list[list[Any]], list[int]]:
    names = draw(st.lists(IDENT, min_size=1, max_size=5, unique_by=lambda s: s))
    types = [draw(st.sampled_from(sorted(TYPES))) for _ in names]
    nrows = draw(st.integers(1, 4))
    rows = [[draw(st.one_of(st.none(), TYPES[t])) for t in types] for _ in range(nrows)]
    updates = draw(st.lists(st.integers(0, nrows - 1), max_size=2, unique=True))
    return names, types, rows, updates


def _decode_all(conn: Any, slot: str, plugin: str) -> list[Any]:
    options = peek_options(plugin, publications=["allpub"])
    decode = make_decoder(plugin, 1)
    events = []
    last_commit = None
    for lsn, xid, data in peek_rows(conn, slot, plugin, options=options, raw_text=True):
        event = decode(data, lsn, xid)
        if isinstance(event, Commit):
            last_commit = lsn
        events.append(event)
    if last_commit is not None:
        advance_slot(conn, slot, last_commit)
    return [e for e in events if isinstance(e, RowChange)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(workload=workloads())
def test_both_plugins_decode_to_the_text_postgresql_prints(db: Any, workload: Any) -> None:
    db.require_plugin("test_decoding")
    names, types, rows, updates = workload
    conn = connect(ConnectionTarget(db.dsn, "test"))  # the same pinned settings as pgpoll's peeks
    cur = conn.cursor()
    if not db.execute("SELECT 1 FROM pg_publication WHERE pubname = 'allpub'"):
        db.execute("CREATE PUBLICATION allpub FOR ALL TABLES")
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot('prop_td', 'test_decoding')")
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot('prop_po', 'pgoutput')")
    table = sql.Identifier("Sch ema", f'T"{next(_counter)}. x')
    cur.execute('CREATE SCHEMA IF NOT EXISTS "Sch ema"')
    cols = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in zip(names, types, strict=False))
    cur.execute(sql.SQL("CREATE TABLE {} (pgpoll_id int PRIMARY KEY, {})").format(table, cols))
    # the type's output function (format's %s), as both plugins print; booleans as bool::text prints them
    texts = sql.SQL(", ").join(
        sql.SQL("{0}::text" if t == "boolean" else "CASE WHEN {0} IS NULL THEN NULL ELSE format('%s', {0}) END").format(
            sql.Identifier(n)
        )
        for n, t in zip(names, types, strict=False)
    )
    expected: list[tuple[Op, dict[str, Any]]] = []
    for i, row in enumerate(rows):
        values = [_literal(t, v) for t, v in zip(types, row, strict=False)]
        # values as literals, not parameters: a name such as "%" must not meet psycopg2's % placeholders
        cur.execute(
            sql.SQL("INSERT INTO {} VALUES ({}, {}) RETURNING {}").format(
                table, sql.Literal(i),
                sql.SQL(", ").join(
                    sql.SQL("({})::{}").format(sql.Literal(v), sql.SQL(t)) for v, t in zip(values, types, strict=False)
                ),
                texts,
            )
        )
        expected.append((Op.INSERT, {"pgpoll_id": str(i), **dict(zip(names, cur.fetchone(), strict=False))}))
    for i in updates:
        cur.execute(sql.SQL("UPDATE {} SET {} = {} WHERE pgpoll_id = {} RETURNING {}").format(
            table, sql.Identifier(names[0]), sql.Identifier(names[0]), sql.Literal(i), texts))
        expected.append((Op.UPDATE, {"pgpoll_id": str(i), **dict(zip(names, cur.fetchone(), strict=False))}))
    cur.execute(sql.SQL("DELETE FROM {} WHERE pgpoll_id = 0").format(table))
    expected.append((Op.DELETE, {"pgpoll_id": "0"}))

    for slot, plugin in (("prop_td", "test_decoding"), ("prop_po", "pgoutput")):
        got = [e for e in _decode_all(conn, slot, plugin) if e.table == table.strings[1]]
        assert [e.op for e in got] == [op for op, _ in expected], plugin
        for event, (op, values) in zip(got, expected, strict=False):
            assert event.schema == "Sch ema"
            if op is Op.DELETE:
                assert event.before == values, plugin
            else:
                assert event.after == values, (plugin, event.after, values)
    conn.close()
