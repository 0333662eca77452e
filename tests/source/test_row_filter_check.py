"""Row filters against a real server: start-up checks, and pgoutput as the oracle for client-side filtering.

The oracle tests put the same filter on a publication (PostgreSQL 15+ applies
it in pgoutput) and on pgpoll's TableFilters (applied to test_decoding's
changes), run the same workload, and require the same (op, old key, new row)
sequence from both.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg2 import sql

from pgpoll.changes import RowChange
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.decode.text_decoder import TestDecodingDecoder
from pgpoll.errors import ConfigError
from pgpoll.rowfilter import TableFilters, parse_row_filter
from pgpoll.rowfilter.evaluate import compile_filter
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.row_filter_check import check_row_filters
from pgpoll.source.slots import peek_options, peek_rows


def _check(db: Any, *specs: str) -> dict[tuple[str, str], tuple[str, ...]]:
    conn = connect(ConnectionTarget(db.dsn, "test"))
    try:
        return check_row_filters(conn, [parse_row_filter(s) for s in specs])
    finally:
        conn.close()


def test_missing_table_and_column(db: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    with pytest.raises(ConfigError, match=r"table public\.nope does not exist"):
        _check(db, "nope: (id > 1)")
    with pytest.raises(ConfigError, match="column w does not exist"):
        _check(db, "t: (id > 1 AND w = 2)")
    with pytest.raises(ConfigError, match=r"table public\.T does not exist"):
        _check(db, '"T": (id > 1)')  # quoted: case kept


def test_replica_identity_default_full_nothing_and_index(db: Any) -> None:
    db.execute("CREATE TABLE d (id int PRIMARY KEY, v int)")
    assert _check(db, "d: (id > 1)") == {("public", "d"): ("id",)}
    with pytest.raises(ConfigError, match=r"uses v, outside the replica identity \(REPLICA IDENTITY DEFAULT") as info:
        _check(db, "d: (v > 1)")
    assert "REPLICA IDENTITY FULL" in (info.value.hint or "")
    db.execute("ALTER TABLE d REPLICA IDENTITY FULL")
    assert _check(db, "d: (v > 1)") == {("public", "d"): ("id", "v")}
    db.execute("ALTER TABLE d REPLICA IDENTITY NOTHING")
    with pytest.raises(ConfigError, match="REPLICA IDENTITY NOTHING"):
        _check(db, "d: (id > 1)")
    db.execute("CREATE TABLE i (a int NOT NULL, b int NOT NULL, c int, PRIMARY KEY (c))")
    db.execute("CREATE UNIQUE INDEX i_ba ON i (b, a)")
    db.execute("ALTER TABLE i REPLICA IDENTITY USING INDEX i_ba")
    assert _check(db, "i: (a > 1 AND b < 2)") == {("public", "i"): ("b", "a")}
    with pytest.raises(ConfigError, match="REPLICA IDENTITY USING INDEX"):
        _check(db, "i: (c > 1)")  # the primary key is not the identity here
    db.execute("CREATE TABLE nokey (a int)")
    with pytest.raises(ConfigError, match="no primary key"):
        _check(db, "nokey: (a > 1)")


def test_quoted_identifiers_types_and_partitions(db: Any) -> None:
    db.execute('CREATE SCHEMA "My Schema"')
    db.execute('CREATE TABLE "My Schema"."T 1" ("Col" int PRIMARY KEY, d date)')
    assert _check(db, '"My Schema"."T 1": ("Col" > 5)') == {("My Schema", "T 1"): ("Col",)}
    with pytest.raises(ConfigError, match="column col does not exist"):
        _check(db, '"My Schema"."T 1": (Col > 5)')
    db.execute('ALTER TABLE "My Schema"."T 1" REPLICA IDENTITY FULL')
    with pytest.raises(ConfigError, match="not a valid date"):
        _check(db, "\"My Schema\".\"T 1\": (d > '2024-02-30')")
    db.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
    with pytest.raises(ConfigError, match="partitioned"):
        _check(db, "p: (id > 1)")
    assert _check(db, "p1: (id > 1)") == {("public", "p1"): ("id",)}


# ---- evaluation against SQL -------------------------------------------------------------

_SQL_CASES = [
    ("integer", "10", "(x > 9)"), ("integer", "10", "(x > '9')"), ("integer", None, "(x IN (1, NULL))"),
    ("integer", "2", "(x NOT IN (1, NULL))"), ("integer", "4", "(x NOT BETWEEN 1 AND 3)"),
    ("numeric(10,2)", "NaN", "(x > 1000000)"), ("numeric(10,2)", "NaN", "(x = 'NaN')"),
    ("numeric(10,2)", "1.5", "(x = 1.50)"), ("real", "0.1", "(x = 0.1)"), ("real", "0.1", "(x = '0.1')"),
    ("double precision", "NaN", "(x > 'Infinity')"), ("double precision", "0.1", "(x = 0.1)"),
    ("text", "a", "(x < 'b')"), ("character(5)", "ab", "(x = 'ab')"), ("boolean", "true", "(x)"),
    ("boolean", None, "(x IS NOT TRUE)"), ("boolean", "false", "(x = 'no')"),
    ("date", "2024-01-02", "(x > '2024-01-01')"), ("date", "0044-03-15 BC", "(x < '0001-01-01'::date)"),
    ("timestamp without time zone", "2024-01-01 10:00:00.5", "(x > '2024-01-01 10:00')"),
    ("timestamp with time zone", "2024-01-01 00:00:00+00", "(x = '2024-01-01 01:00:00+01')"),
    ("timestamp with time zone", "2024-01-01 00:00:01+00", "(x > '2024-01-01')"),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "(x = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')"),
    ("integer", None, "(x IS DISTINCT FROM NULL)"), ("integer", "3", "(x IS NOT DISTINCT FROM 3)"),
]


def test_evaluation_matches_postgresql(db: Any) -> None:
    """Each expression is evaluated by the server on the same value (pgpoll's session settings)."""
    conn = connect(ConnectionTarget(db.dsn, "test"))
    cur = conn.cursor()
    for type_name, value, expr in _SQL_CASES:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS v; CREATE TABLE v (x {})").format(sql.SQL(type_name)))
        cur.execute("INSERT INTO v VALUES (%s) RETURNING CASE WHEN x IS NULL THEN NULL ELSE format('%%s', x) END",
                    (value,))
        text = cur.fetchone()[0]
        # the expression was parsed by pgpoll's strict parser first: only the subset reaches the server
        flt = parse_row_filter(f"v: {expr}")
        cur.execute(sql.SQL("SELECT {} FROM v").format(sql.SQL(flt.text)))
        expected = cur.fetchone()[0]
        got = compile_filter(flt, {"x": type_name})({"x": text if type_name != "boolean" or text is None
                                                     else ("true" if text in ("t", "true") else "false")})
        assert got == expected, (type_name, value, expr)
    conn.close()


# ---- pgoutput as the oracle ---------------------------------------------------------------


def _changes(conn: Any, slot: str, plugin: str, publications: list[str]) -> list[RowChange]:
    decoder: Any = PgoutputDecoder(1) if plugin == "pgoutput" else TestDecodingDecoder()
    out = []
    for lsn, xid, data in peek_rows(conn, slot, plugin, options=peek_options(plugin, publications=publications)):
        event = decoder.decode(data, lsn) if plugin == "pgoutput" else decoder.decode(data, lsn=lsn, xid=xid)
        if isinstance(event, RowChange):
            out.append(event)
    return out


def _key(values: Any | None, key: tuple[str, ...]) -> dict[str, str | None] | None:
    return None if values is None else {k: values.get(k) for k in key}


def _run_oracle(db: Any, table: str, identity_full: bool, filters: list[str], workload: list[str]) -> list[str]:
    db.require_plugin("test_decoding")
    if db.major < 15:
        pytest.skip("publication row filters need PostgreSQL 15")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int, s text, n numeric, flag boolean, d date, big text)")
    if identity_full:
        db.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    pubs = []
    for i, expr in enumerate(filters):
        pubs.append(f"pub{i}")
        db.execute(f"CREATE PUBLICATION pub{i} FOR TABLE {table} WHERE {expr}")
    td, po = db.slot_name("td"), db.slot_name("po")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (td,))
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (po,))
    for statement in workload:
        db.execute(statement.format(t=table))
    conn = connect(ConnectionTarget(db.dsn, "test"))
    keys = check_row_filters(conn, [parse_row_filter(f"{table}: {e}") for e in filters])
    key = keys[("public", table)] if not identity_full else ("id",)
    table_filters = TableFilters([parse_row_filter(f"{table}: {e}") for e in filters])
    expected = [(c.op.value, _key(c.before, key), dict(c.after) if c.after is not None else None)
                for c in _changes(conn, po, "pgoutput", pubs) if c.table == table]
    got = []
    for c in _changes(conn, td, "test_decoding", pubs):
        types = {col.name: col.type_name or "" for col in c.columns}
        kept = table_filters.transform(c.op.value, c.schema, c.table, c.before, c.after, types)
        if kept is not None:
            op, before, after = kept
            got.append((op, _key(before, key), dict(after) if after is not None else None))
    conn.close()
    assert got == expected
    return [op for op, _, _ in expected]


_BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"  # ~9.6kB, stored out of line


def test_oracle_key_filter_default_identity_two_publications_ored(db: Any) -> None:
    ops = _run_oracle(db, "k", False, ["(id > 10 AND id <> 15)", "(id IN (3, 4))"], [
        "INSERT INTO {t} (id, v, s) SELECT g, g, 's' || g FROM generate_series(1, 20) g",
        "UPDATE {t} SET v = v + 1 WHERE id IN (2, 3, 12, 15)",  # key unchanged: no old row
        "UPDATE {t} SET id = 50 WHERE id = 5",   # out -> in: INSERT
        "UPDATE {t} SET id = 2000 WHERE id = 3",  # in (IN list) -> in: UPDATE
        "UPDATE {t} SET id = 0 WHERE id = 12",   # in -> out: DELETE
        "DELETE FROM {t} WHERE id = 15",
        "UPDATE {t} SET id = 15 WHERE id = 13",  # in -> out (<> 15): DELETE
        "UPDATE {t} SET id = -7 WHERE id = 7",   # out -> out: dropped
        "DELETE FROM {t} WHERE id IN (0, 11, 2, 4, 2000)",
    ])
    # inserts of 3, 4, 11..14, 16..20, then the transformed updates and the deletes
    assert ops.count("I") >= 12 and "U" in ops and ops.count("D") >= 4


def test_oracle_non_key_filter_full_identity_nulls_and_toast(db: Any) -> None:
    ops = _run_oracle(db, "f", True, ["((v >= 100 OR s = 'keep') AND s IS NOT NULL)"], [
        "INSERT INTO {t} (id, v, s) VALUES (1, 150, 'a'), (2, 5, 'keep'), (3, 5, 'b'), (4, NULL, 'keep'), "
        "(5, 500, NULL), (6, NULL, NULL)",
        "INSERT INTO {t} (id, v, s, big) VALUES (7, 1, 'b', " + _BIG + "), (8, 200, 'x', " + _BIG + ")",
        "UPDATE {t} SET v = 1 WHERE id = 1",      # in -> out: DELETE
        "UPDATE {t} SET s = 'keep' WHERE id = 3",  # out -> in: INSERT
        "UPDATE {t} SET s = NULL WHERE id = 4",    # in -> NULL: DELETE
        "UPDATE {t} SET s = 'z' WHERE id = 5",     # NULL -> in: INSERT
        "UPDATE {t} SET v = 300 WHERE id = 7",     # out -> in with unchanged TOAST: INSERT (big from old row)
        "UPDATE {t} SET v = 2 WHERE id = 8",       # in -> out with unchanged TOAST: DELETE
        "UPDATE {t} SET v = v + 1 WHERE id = 2",   # in -> in: UPDATE
        "UPDATE {t} SET v = 7 WHERE id = 6",       # out -> out: dropped
        "DELETE FROM {t} WHERE id IN (2, 3, 6)",
    ])
    assert ops == ["I", "I", "I", "I", "D", "I", "D", "I", "I", "D", "U", "D", "D"]


def test_oracle_typed_filter_full_identity(db: Any) -> None:
    ops = _run_oracle(db, "ty", True, ["(n > 1.5 AND flag AND d >= '2024-01-01')", "(n = 'NaN' AND flag IS NOT TRUE)"], [
        "INSERT INTO {t} (id, n, flag, d) VALUES (1, 2, true, '2024-06-01'), (2, 10, true, '2023-12-31'), "
        "(3, 'NaN', true, '2024-01-01'), (4, 'NaN', NULL, '2020-01-01'), (5, 1.5, true, '2025-01-01'), "
        "(6, 1.50001, false, 'infinity')",
        "UPDATE {t} SET flag = false WHERE id = 1",
        "UPDATE {t} SET d = '2024-01-01' WHERE id = 2",
        "UPDATE {t} SET flag = false WHERE id = 3",
        "UPDATE {t} SET n = 1.49 WHERE id = 4",
        "UPDATE {t} SET flag = true WHERE id = 6",
        "DELETE FROM {t}",
    ])
    assert {"I", "D"} <= set(ops) and len(ops) >= 4
