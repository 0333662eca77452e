"""``status``'s server side on a real server: slots and clock, captured tables, cumulative write counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgpoll.source import slots
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.server_state import captured_tables, read_server_state, table_key, table_write_counts
from pgpoll.source.slot_copies import copy_name


@pytest.fixture
def conn(db: Any) -> Iterator[Any]:
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


def write(db: Any, *statements: str) -> None:
    """Run ``statements`` in one transaction on one session, then make that session report its statistics."""
    session = db.connect(autocommit=False)
    with session.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    session.commit()
    session.autocommit = True
    if db.major >= 15:
        with session.cursor() as cur:  # reported when the session next goes idle, i.e. right after this
            cur.execute("SELECT pg_stat_force_next_flush()")
    session.close()  # a session also reports when it ends


def eventually(read: Callable[[], Any], expected: Any, timeout: float = 10.0) -> Any:
    """Poll ``read()`` until it returns ``expected`` (statistics arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    value = read()
    while value != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def test_write_counts_grow_with_inserts_updates_and_deletes(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute('CREATE SCHEMA "Odd Schema"')
    db.execute('CREATE TABLE "Odd Schema"."Mixed.Case" (id int)')
    tables = [("public", "items"), ("Odd Schema", "Mixed.Case"), ("public", "absent")]
    assert table_write_counts(conn, tables) == {"public.items": [0, 0, 0], "Odd Schema.Mixed.Case": [0, 0, 0]}

    write(db, "INSERT INTO items SELECT g, 'a' FROM generate_series(1, 10) g",
          "UPDATE items SET v = 'b' WHERE id <= 4", "DELETE FROM items WHERE id > 8")
    write(db, 'INSERT INTO "Odd Schema"."Mixed.Case" VALUES (1), (2)')
    expected = {"public.items": [10, 4, 2], "Odd Schema.Mixed.Case": [2, 0, 0]}
    assert eventually(lambda: table_write_counts(conn, tables), expected) == expected

    every = table_write_counts(conn, None)  # test_decoding: every user table
    assert every["public.items"] == [10, 4, 2] and every["Odd Schema.Mixed.Case"] == [2, 0, 0]
    assert not any(key.startswith(("pg_catalog.", "information_schema.")) for key in every)
    assert table_write_counts(conn, []) == {}
    assert table_key("Odd Schema", "Mixed.Case") == "Odd Schema.Mixed.Case"


def test_a_rolled_back_write_counts_too_so_equal_counts_mean_nothing_was_written(db: Any, conn: Any) -> None:
    # The counts say "something may have been written", never how much: status only compares them for equality.
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    session = db.connect(autocommit=False)
    with session.cursor() as cur:
        cur.execute("INSERT INTO items VALUES (1)")
    session.rollback()
    session.close()
    before = table_write_counts(conn, [("public", "items")])
    assert eventually(lambda: table_write_counts(conn, [("public", "items")]), {"public.items": [1, 0, 0]}) \
        == {"public.items": [1, 0, 0]}, before


def test_a_partitioned_table_counts_the_rows_of_its_partitions(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE events (id int, at date) PARTITION BY RANGE (at)")
    db.execute("CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    db.execute("CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')")
    write(db, "INSERT INTO events VALUES (1, '2024-05-01'), (2, '2025-05-01'), (3, '2025-06-01')",
          "DELETE FROM events WHERE id = 3")
    expected = {"public.events": [3, 0, 1], "public.events_2025": [2, 0, 1]}
    assert eventually(lambda: table_write_counts(conn, [("public", "events"), ("public", "events_2025")]),
                      expected) == expected


def test_captured_tables_of_publications(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)")
    db.execute("CREATE TABLE b (id int PRIMARY KEY)")
    db.execute('CREATE SCHEMA "S"')
    db.execute('CREATE TABLE "S".c (id int PRIMARY KEY)')
    db.execute('CREATE PUBLICATION p1 FOR TABLE a, "S".c')
    db.execute("CREATE PUBLICATION p2 FOR TABLE a, b")
    assert captured_tables(conn, ["p1"]) == [("S", "c"), ("public", "a")]
    assert captured_tables(conn, ["p1", "p2", "absent"]) == [("S", "c"), ("public", "a"), ("public", "b")]
    assert captured_tables(conn, []) == []
    write(db, "INSERT INTO b VALUES (1)")
    counts = table_write_counts(conn, captured_tables(conn, ["p2"]))
    assert set(counts) == {"public.a", "public.b"}


def test_the_reads_leave_the_connection_idle_in_its_own_mode(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE a (id int)")
    conn.autocommit = True
    table_write_counts(conn, [("public", "a")])
    captured_tables(conn, ["p"])
    assert conn.autocommit is True
    assert conn.get_transaction_status() == 0  # TRANSACTION_STATUS_IDLE


def test_read_server_state_lists_the_databases_logical_slots(db: Any, conn: Any) -> None:
    db.require_plugin("test_decoding")
    name = db.slot_name()
    slots.create_slot(conn, name, "test_decoding")
    state = read_server_state(conn)
    assert state.database == db.name and [s.name for s in state.slots] == [name]
    assert read_server_state(conn, name).slots[0].name == name


def test_read_server_state_leaves_out_ingests_temporary_copies(db: Any, conn: Any) -> None:
    db.require_plugin("test_decoding")
    name = db.slot_name()
    slots.create_slot(conn, name, "test_decoding")
    copy = copy_name(name)
    holder = db.connect(autocommit=False)  # a copy lives in its session's transaction, as ingest makes it
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_copy_logical_replication_slot(%s, %s, true)", (name, copy))
        listed = [s.name for s in slots.list_slots(conn)]
        assert copy in listed and name in listed  # the server has both while the batch decodes
        assert [s.name for s in read_server_state(conn).slots] == [name]  # status and its metrics see the slot only
    finally:
        holder.rollback()
        holder.close()
