"""Catalog lookups: replica identity and full column types, and their errors translated into pgpoll's."""

from __future__ import annotations

from typing import Any

import pytest

from pgpoll.errors import ConnectionFailedError
from pgpoll.source.catalog import catalog_table
from pgpoll.source.connection import connect, resolve_dsn


def test_catalog_table_reads_identity_key_and_full_types(db: Any) -> None:
    db.execute("CREATE DOMAIN price AS numeric(12,2)")
    db.execute("CREATE TABLE t (a int, b price, c varchar(7), PRIMARY KEY (b, a))")
    conn = connect(resolve_dsn(db.dsn))
    try:
        described = catalog_table(conn, "public", "t")
        assert described is not None
        assert (described.identity, described.key) == ("d", ("b", "a"))
        assert described.base_types["b"] == ("price", "numeric(12,2)")
        assert described.base_types["c"] == ("character varying", "character varying(7)")
        assert catalog_table(conn, "public", "absent") is None
    finally:
        conn.close()


def test_catalog_errors_become_pgpoll_errors(db: Any) -> None:
    conn = connect(resolve_dsn(db.dsn))
    db.execute("SELECT pg_terminate_backend(%s)", (conn.get_backend_pid(),))
    with pytest.raises(ConnectionFailedError) as caught:
        catalog_table(conn, "public", "t")
    assert "lost the connection" in caught.value.message
    conn.close()


def test_a_lost_connection_keeps_raising_pgpoll_errors(db: Any) -> None:
    from pgpoll.source.slots import list_slots

    conn = connect(resolve_dsn(db.dsn))
    db.execute("SELECT pg_terminate_backend(%s)", (conn.get_backend_pid(),))
    for _ in range(2):  # the second call meets a connection psycopg2 already knows is broken
        with pytest.raises(ConnectionFailedError):
            catalog_table(conn, "public", "t")
        with pytest.raises(ConnectionFailedError):
            list_slots(conn)
    conn.close()
