"""What a snapshot reads: tables, columns, keys, modes and schema ids equal to the typed tables' for each plugin."""

from __future__ import annotations

from typing import Any

import pytest

from pgpoll.changes import RowChange
from pgpoll.decode.decoders import make_decoder
from pgpoll.decode.pgoutput_decoder import PgoutputDecoder
from pgpoll.errors import ConfigError, PublicationNotFoundError
from pgpoll.source.catalog import catalog_table
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.snapshot.catalog import (
    CHUNKED,
    SHARED,
    Collation,
    code_point_ordered,
    describe_table,
    key_order_reproducible,
    snapshot_tables,
)
from pgpoll.table_patterns import TablePatterns
from pgpoll.typed.schemas import schema_from_columns, schema_from_relation

_SETUP = """
CREATE DOMAIN price AS numeric(12,2);
CREATE TYPE mood AS ENUM ('sad', 'ok');
CREATE DOMAIN d2 AS price;
CREATE TABLE wide (b text COLLATE "C", a int, p price, m mood, ms mood[], q d2, v varchar(7), n numeric(10,3),
                   dropped int, ts timestamptz, c char(3), g int GENERATED ALWAYS AS (a * 2) STORED, PRIMARY KEY (b, a));
ALTER TABLE wide DROP COLUMN dropped;
CREATE TABLE full_t (x int, y text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (u uuid NOT NULL, z bytea NOT NULL, w int);
CREATE UNIQUE INDEX idx_t_uz ON idx_t (z, u);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_uz;
"""

_ROWS = """
INSERT INTO wide (b, a, p, m, ms, q, v, n, ts, c) VALUES ('k', 1, 1.5, 'ok', '{sad,ok}', 2.25, 'v', 1.125, now(), 'ab');
INSERT INTO full_t VALUES (1, 'x');
INSERT INTO idx_t VALUES (gen_random_uuid(), '\\x01', 3);
"""


def _stream_schemas(db: Any, slot: str, plugin: str, conn: Any) -> dict[str, Any]:
    """Schemas the ingest computes from the slot's own stream, by table."""
    out: dict[str, Any] = {}
    if plugin == "pgoutput":
        rows = db.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                          "'proto_version', '1', 'publication_names', 'pub')", (slot,))
        decoder = PgoutputDecoder(1)
        for _lsn, data in rows:
            decoder.decode(bytes(data), None)
        for rel in decoder.relations.values():
            schema = schema_from_relation(rel, decoder.types)
            out[schema.table] = schema
        return out
    decode = make_decoder("test_decoding")
    for _lsn, xid, data in db.execute("SELECT lsn::text, xid::text::bigint, data FROM "
                                      "pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,)):
        event = decode(data, None, xid)
        if isinstance(event, RowChange):
            out[event.table] = schema_from_columns(event.schema, event.table,
                                                   [(c.name, c.type_name) for c in event.columns],
                                                   catalog_table(conn, event.schema, event.table))
    return out


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_schema_ids_equal_what_the_typed_tables_compute(db_any: Any, plugin: str) -> None:
    db = db_any
    db.require_plugin(plugin)
    db.execute(_SETUP)
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    slot = db.slot_name()
    db.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    db.execute(_ROWS)
    conn = connect(resolve_dsn(db.dsn))
    try:
        tables = {t.table: t for t in snapshot_tables(conn, plugin=plugin, publications=["pub"],
                                                       patterns=TablePatterns())}
        expected = _stream_schemas(db, slot, plugin, conn)
    finally:
        conn.close()
    assert set(expected) == {"wide", "full_t", "idx_t"} <= set(tables)
    for name, schema in expected.items():
        assert list(tables[name].table_schema.columns) == list(schema.columns), name
        assert tables[name].table_schema == schema, name
        assert tables[name].table_schema.schema_id == schema.schema_id, name
    wide, full, idx = tables["wide"], tables["full_t"], tables["idx_t"]
    # the key orders as in Spark: chunks, TOASTable columns beside it or not; those make a recheck
    assert (wide.key, wide.key_kinds, wide.mode, wide.recheck) == (("b", "a"), ("text", "int4"), CHUNKED, True)
    assert (full.key, full.identity, full.mode, full.warning) == ((), "f", SHARED, None)
    assert "REPLICA IDENTITY FULL" in full.mode_reason
    assert (idx.key, idx.mode, idx.recheck) == (("z", "u"), CHUNKED, False)  # (a key's value is never left unchanged)
    assert "g" not in wide.names if plugin == "pgoutput" else "g" in wide.names


def test_modes_follow_whether_spark_orders_the_key_as_postgresql(db: Any) -> None:
    db.execute("""
        CREATE TABLE k_int (id bigint PRIMARY KEY, v int);
        CREATE TABLE k_toast (id bigint PRIMARY KEY, v text);
        CREATE TABLE k_plain (id bigint PRIMARY KEY, v text);
        ALTER TABLE k_plain ALTER COLUMN v SET STORAGE PLAIN;
        CREATE TABLE k_num (id numeric PRIMARY KEY);
        CREATE TABLE k_text_c (id text PRIMARY KEY);
        CREATE TABLE k_text_utf8 (id text COLLATE "C.utf8" PRIMARY KEY);
        CREATE TABLE k_float (id float8 PRIMARY KEY);
        CREATE TABLE k_none (id int);
        CREATE TABLE k_nothing (id int PRIMARY KEY);
        ALTER TABLE k_nothing REPLICA IDENTITY NOTHING;
    """)
    conn = connect(resolve_dsn(db.dsn))
    try:
        got = {t.table: t for t in snapshot_tables(conn, plugin="test_decoding", publications=[],
                                                   patterns=TablePatterns(("k_*",)))}
    finally:
        conn.close()
    assert {n: t.mode for n, t in got.items()} == {
        "k_int": CHUNKED, "k_toast": CHUNKED, "k_plain": CHUNKED, "k_num": SHARED,
        "k_text_c": CHUNKED,  # the test cluster's default collation is C
        "k_text_utf8": SHARED, "k_float": SHARED, "k_none": SHARED, "k_nothing": SHARED,
    }
    assert {n for n, t in got.items() if t.recheck} == {"k_toast"}  # the one chunked table with a TOASTable column
    assert got["k_none"].key == () and "cannot be matched" in (got["k_none"].warning or "")
    assert got["k_nothing"].key == () and got["k_nothing"].warning
    assert "only the server knows its order" in got["k_num"].mode_reason and "numeric" in got["k_num"].mode_reason
    assert "libc collation C.utf8" in got["k_text_utf8"].mode_reason
    assert "orders alike" in got["k_int"].mode_reason
    conn = connect(resolve_dsn(db.dsn))
    try:
        forced = snapshot_tables(conn, plugin="test_decoding", publications=[], patterns=TablePatterns(("k_int",)),
                                 mode="shared")
    finally:
        conn.close()
    assert [(t.mode, t.mode_reason, t.recheck) for t in forced] == [(SHARED, "--mode shared", False)]


def test_a_database_with_a_non_c_default_collation_reads_text_keys_shared(db: Any) -> None:
    name = db.name + "_u"
    db.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 LC_COLLATE "C.utf8" LC_CTYPE "C.utf8"')
    try:
        other = connect(resolve_dsn(db.server.dsn(name)))
        try:
            with other.cursor() as cur:
                cur.execute("CREATE TABLE t (id text PRIMARY KEY); CREATE TABLE c (id text COLLATE \"C\" PRIMARY KEY)")
            assert describe_table(other, "public", "t", plugin="test_decoding").mode == SHARED
            assert describe_table(other, "public", "c", plugin="test_decoding").mode == CHUNKED
        finally:
            other.close()
    finally:
        db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_collation_rules() -> None:
    libc_c, icu = Collation("c", "C"), Collation("i", None)
    assert code_point_ordered(Collation("d", None), libc_c)
    assert not code_point_ordered(Collation("d", None), Collation("c", "en_US.utf8"))
    assert not code_point_ordered(Collation("d", None), icu)
    assert code_point_ordered(Collation("b", "C.UTF-8"), icu)  # builtin provider (PG 17+): code point order
    assert code_point_ordered(Collation("c", "POSIX"), icu)
    assert not code_point_ordered(Collation("c", "C.utf8"), libc_c)
    assert key_order_reproducible("int8", None, icu) and key_order_reproducible("uuid", None, icu)
    assert key_order_reproducible("bytea", None, icu)
    assert not key_order_reproducible("bpchar", Collation("c", "C"), libc_c)
    assert not key_order_reproducible("numeric", None, libc_c)
    assert not key_order_reproducible(None, Collation("c", "C"), libc_c)  # a type outside pg_catalog


def test_publications_give_names_column_lists_filters_and_refusals(db_any: Any) -> None:
    db = db_any
    db.execute("""
        CREATE TABLE a (id int PRIMARY KEY, x text, secret text, g int GENERATED ALWAYS AS (id) STORED);
        CREATE TABLE outside (id int PRIMARY KEY);
        CREATE TABLE gen (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id) STORED);
        CREATE TABLE m (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
        CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (10);
        CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (10) TO (20);
        CREATE PUBLICATION p1 FOR TABLE a (id, x) WHERE (id > 10), m;
        CREATE PUBLICATION p2 FOR TABLE m WITH (publish_via_partition_root = true);
        CREATE PUBLICATION p3 FOR TABLE gen;
    """)
    conn = connect(resolve_dsn(db.dsn))
    try:
        leaves = {t.table: t for t in snapshot_tables(conn, plugin="pgoutput", publications=["p1"],
                                                      patterns=TablePatterns())}
        assert set(leaves) == {"a", "m1", "m2"}
        a = leaves["a"]
        assert a.names == ("id", "x") and a.column_list == ("id", "x")
        assert a.row_filter is not None and "10" in a.row_filter
        assert leaves["m1"].column_list is None and leaves["m1"].row_filter is None
        assert not leaves["m1"].partitioned
        # a pattern naming the partitioned root selects the leaves the publication lists
        assert {t.table for t in snapshot_tables(conn, plugin="pgoutput", publications=["p1"],
                                                 patterns=TablePatterns(("public.m",)))} == {"m1", "m2"}
        roots = snapshot_tables(conn, plugin="pgoutput", publications=["p2"], patterns=TablePatterns())
        assert [(t.table, t.partitioned, t.leaves, t.mode) for t in roots] == [
            ("m", True, (("public", "m1"), ("public", "m2")), CHUNKED)]
        assert roots[0].relfilenode > 0
        full = snapshot_tables(conn, plugin="pgoutput", publications=["p1"], patterns=TablePatterns(("a",)))
        assert [t.table for t in full] == ["a"]
        with pytest.raises(ConfigError, match="not in publication"):
            snapshot_tables(conn, plugin="pgoutput", publications=["p1"], patterns=TablePatterns(("outside",)))
        with pytest.raises(ConfigError, match="matches no"):
            snapshot_tables(conn, plugin="pgoutput", publications=["p1"], patterns=TablePatterns(("nothing*",)))
        with pytest.raises(PublicationNotFoundError):
            snapshot_tables(conn, plugin="pgoutput", publications=["p1", "absent"], patterns=TablePatterns())
        with pytest.raises(ConfigError, match="needs a publication"):
            snapshot_tables(conn, plugin="pgoutput", publications=[], patterns=TablePatterns())
        gen = snapshot_tables(conn, plugin="pgoutput", publications=["p3"], patterns=TablePatterns())
        assert [(t.names, t.column_list) for t in gen] == [(("id",), None)]  # pgoutput does not send g
        excluded = snapshot_tables(conn, plugin="pgoutput", publications=["p1"], patterns=TablePatterns((), ("m*",)))
        assert [t.table for t in excluded] == ["a"]
    finally:
        conn.close()


def test_test_decoding_lists_leaves_not_roots(db: Any) -> None:
    db.execute("""
        CREATE TABLE m (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
        CREATE TABLE m1 PARTITION OF m FOR VALUES FROM ('2020-01-01') TO ('2021-01-01');
        CREATE TABLE plain (id int PRIMARY KEY);
        CREATE UNLOGGED TABLE scratch (id int);
    """)
    conn = connect(resolve_dsn(db.dsn))
    try:
        got = snapshot_tables(conn, plugin="test_decoding", publications=[], patterns=TablePatterns())
        assert sorted(t.table for t in got) == ["m1", "plain"]
        with pytest.raises(ConfigError, match="matches no table"):
            snapshot_tables(conn, plugin="test_decoding", publications=[], patterns=TablePatterns(("nope",)))
    finally:
        conn.close()
