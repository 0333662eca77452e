"""Real PostgreSQL errors translate to the right pgpoll error, with a fix; which ones are transient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg2
import pytest

from pgpoll import errors
from pgpoll.source.server_errors import is_transient, translate


def server_error(db: Any, query: str, params: Any = None, *, role: str | None = None) -> psycopg2.Error:
    conn = db.connect()
    with conn.cursor() as cur:
        if role:
            cur.execute(f'SET ROLE "{role}"')
        with pytest.raises(psycopg2.Error) as caught:
            cur.execute(query, params)
    return caught.value


@pytest.fixture
def slot(db: Any) -> str:
    name: str = db.slot_name()
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    return name


def test_missing_slot(db: Any) -> None:
    error = translate(server_error(db, "SELECT pg_replication_slot_advance('nope', '0/1')"), slot="nope")
    assert type(error) is errors.SlotNotFoundError and error.sqlstate == "42704"
    assert error.message == 'replication slot "nope" does not exist'


def test_duplicate_slot(db: Any, slot: str) -> None:
    error = translate(server_error(db, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)))
    assert type(error) is errors.SlotExistsError
    assert "drop the old slot" in (error.hint or "")


def test_role_without_replication(db: Any) -> None:
    role = "noreplication_" + db.name
    db.execute(f"CREATE ROLE {role}")
    try:
        raw = server_error(db, "SELECT pg_create_logical_replication_slot('x', 'pgoutput')", role=role)
    finally:
        db.execute(f"DROP ROLE {role}")
    error = translate(raw)
    assert type(error) is errors.PrivilegeError and error.sqlstate == "42501"
    assert "ALTER ROLE name REPLICATION" in (error.hint or "")


def test_missing_publication_on_pgoutput_peek(db: Any, slot: str) -> None:
    db.execute("CREATE TABLE t (id int)")
    db.execute("INSERT INTO t VALUES (1)")
    raw = server_error(db, "SELECT * FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                           "'proto_version', '1', 'publication_names', 'nope')", (slot,))
    error = translate(raw, slot=slot)
    assert type(error) is errors.PublicationNotFoundError
    assert error.message == 'publication "nope" does not exist'


def test_slot_of_another_database(db: Any, slot: str) -> None:
    conn = psycopg2.connect(db.server.dsn("postgres"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.Error) as caught:
            cur.execute("SELECT * FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                        "'proto_version', '1', 'publication_names', 'p')", (slot,))
    finally:
        conn.close()
    error = translate(caught.value, slot=slot)
    assert type(error) is errors.SourceError
    assert "was not created in this database" in error.message
    assert "connect to the slot's database" in (error.hint or "")


def test_terminated_session_is_a_transient_connection_error(db: Any) -> None:
    victim = db.connect()
    with victim.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with victim.cursor() as cur, pytest.raises(psycopg2.Error) as caught:
        cur.execute("SELECT 1")
    assert is_transient(caught.value)
    error = translate(caught.value)
    assert type(error) is errors.ConnectionFailedError
    assert is_transient(error)


def test_other_errors_are_source_errors_and_not_transient(db: Any) -> None:
    raw = server_error(db, "SELECT 1/0")
    assert not is_transient(raw)
    error = translate(raw)
    assert type(error) is errors.SourceError and error.sqlstate == "22012"
    assert error.message == "division by zero"


@pytest.mark.parametrize(
    ("make", "transient"),
    [
        (lambda: errors.ConnectionFailedError("down", sqlstate="08001"), True),
        (lambda: errors.ConnectionFailedError("no sqlstate"), True),
        (lambda: errors.ConnectionFailedError("bad password", sqlstate="28P01"), False),
        (lambda: errors.SourceError("shutdown", sqlstate="57P01"), True),
        (lambda: errors.SlotNotFoundError("gone"), False),
        (lambda: ValueError("x"), False),
    ],
)
def test_is_transient_for_pgpoll_errors(make: Callable[[], BaseException], transient: bool) -> None:
    assert is_transient(make()) is transient
