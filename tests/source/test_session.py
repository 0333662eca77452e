"""The pinned session settings: one statement inside the transaction, ended with it, on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.session import SESSION_SETTINGS, pin_settings, pinned_transaction


@pytest.fixture
def conn(db: Any) -> Iterator[Any]:
    # The database's own settings differ from every pinned one.
    for setting in ("TimeZone = 'America/New_York'", "DateStyle = 'SQL, DMY'", "IntervalStyle = 'iso_8601'",
                    "extra_float_digits = 3", "bytea_output = 'escape'"):
        db.execute(f'ALTER DATABASE "{db.name}" SET {setting}')
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


def settings(cur: Any) -> dict[str, str]:
    cur.execute("SELECT " + ", ".join("current_setting(%s)" for _ in SESSION_SETTINGS), tuple(SESSION_SETTINGS))
    return dict(zip(SESSION_SETTINGS, cur.fetchone(), strict=True))


def test_pinned_transaction_pins_every_setting_and_prints_values_the_same(conn: Any) -> None:
    with conn.cursor() as cur:
        assert settings(cur)["TimeZone"] == "America/New_York"
    with pinned_transaction(conn) as cur:
        assert settings(cur) == SESSION_SETTINGS
        cur.execute("SELECT '2024-03-10 01:31:00+00'::timestamptz::text, '2024-03-09'::date::text, "
                    "'1 day 02:03:04'::interval::text, 0.1::float8::text, '\\x00ff'::bytea::text")
        assert cur.fetchone() == ("2024-03-10 01:31:00+00", "2024-03-09", "1 day 02:03:04", "0.1", "\\x00ff")
    with conn.cursor() as cur:  # SET LOCAL ended with the transaction (psycopg2 itself sets DateStyle ISO)
        assert (settings(cur)["TimeZone"], settings(cur)["bytea_output"]) == ("America/New_York", "escape")
    assert conn.autocommit is True
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE


def test_pinned_transaction_is_read_only_unless_asked(conn: Any) -> None:
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction), pinned_transaction(conn) as cur:
        cur.execute("CREATE TABLE nope (x int)")
    assert conn.autocommit is True
    with pinned_transaction(conn, readonly=False) as cur:
        cur.execute("CREATE TABLE yes (x int)")
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('yes') IS NOT NULL, to_regclass('nope') IS NULL")
        assert cur.fetchone() == (True, True)


def test_pinned_transaction_rolls_back_on_error_and_restores_autocommit(conn: Any) -> None:
    conn.autocommit = False
    conn.rollback()
    with pytest.raises(RuntimeError, match="boom"), pinned_transaction(conn, readonly=False) as cur:
        cur.execute("CREATE TABLE gone (x int)")
        raise RuntimeError("boom")
    assert conn.autocommit is False
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('gone')")
        assert cur.fetchone() == (None,)
    conn.rollback()


def test_pinned_transaction_joins_an_open_transaction(conn: Any) -> None:
    with pinned_transaction(conn, readonly=False) as outer:
        outer.execute("CREATE TABLE joined (x int)")
        with pinned_transaction(conn) as inner:  # e.g. a catalog read in the middle of a peek
            inner.execute("SELECT to_regclass('joined') IS NOT NULL, current_setting('TimeZone')")
            assert inner.fetchone() == (True, "UTC")
        assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE


def test_pin_settings_binds_values_in_one_statement(conn: Any) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, Any]] = []

        def execute(self, query: str, params: Any) -> None:
            self.calls.append((query, params))

    recorder = Recorder()
    pin_settings(recorder)
    [(query, params)] = recorder.calls
    assert query.count("set_config(%s, %s, true)") == len(SESSION_SETTINGS)
    assert "UTC" not in query and params[:2] == ("TimeZone", "UTC")
    pin_settings(recorder, readonly=True)
    assert "transaction_read_only" in recorder.calls[-1][0]
