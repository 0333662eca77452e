"""The session settings every value-reading transaction pins, and the one way to pin them.

Both plugins print values through the server's output functions, whose text
depends on the session: ``TimeZone`` and ``DateStyle`` (timestamps, dates),
``IntervalStyle``, ``extra_float_digits`` (floats), ``bytea_output``,
``client_encoding`` and ``standard_conforming_strings`` (where a row
filter's string literal ends). pgpoll pins them so that every run, every
plugin and every connection path prints the same text.

They are pinned *inside the transaction that reads*, with
``set_config(name, value, true)`` (the function form of ``SET LOCAL``), and
never through libpq's ``options`` startup parameter or a session-level
``SET``: a connection pooler (PgBouncer) rejects or silently drops
``options``, carries only some settings between its server connections, and
in transaction mode hands each transaction to any server connection, so
session state neither follows the client nor stays private to it. A
transaction-local setting is the one thing that holds on every path and
leaks nowhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.extensions

from pgpoll.source.names import sql_literal

SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    # Fixed so that a row filter's string literals end where pgpoll's scan says.
    "standard_conforming_strings": "on",
}

_PIN_SQL = "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in SESSION_SETTINGS)
_PIN_PARAMS = tuple(part for item in SESSION_SETTINGS.items() for part in item)
# Setting transaction_read_only to on is allowed at any point of a transaction.
_PIN_READONLY_SQL = _PIN_SQL + ", set_config('transaction_read_only', 'on', true)"


def pin_settings_sql(*, readonly: bool = False) -> str:
    """:func:`pin_settings` as one statement with the values written in (for a driver without parameters here).

    The names and values are pgpoll's own constants: quoting them is enough.
    """
    values = [*SESSION_SETTINGS.items(), *([("transaction_read_only", "on")] if readonly else [])]
    return "SELECT " + ", ".join(f"set_config({sql_literal(k)}, {sql_literal(v)}, true)" for k, v in values)


def pin_settings(cursor: Any, *, readonly: bool = False) -> None:
    """Pin :data:`SESSION_SETTINGS` for the rest of the cursor's current transaction (one round trip).

    The connection must be in a transaction (not in autocommit), or the
    settings end with this very statement. ``readonly`` also makes the
    transaction read-only.
    """
    cursor.execute(_PIN_READONLY_SQL if readonly else _PIN_SQL, _PIN_PARAMS)


@contextmanager
def pinned_transaction(conn: Any, *, readonly: bool = True) -> Iterator[Any]:
    """Begin a transaction on ``conn``, pin the settings, yield a cursor; commit, or roll back on error.

    The connection's autocommit mode is restored afterwards, and the
    connection is left idle also when the block stops early (a generator
    closed before its end rolls back). A named (server-side) cursor opened on
    ``conn`` inside the block lives in this transaction, which is what a
    transaction pooler needs. psycopg2 errors propagate unchanged: callers
    translate them (:func:`pgpoll.source.server_errors.translate`).

    Called while ``conn`` is already in a transaction (a catalog lookup in
    the middle of a peek), it joins that transaction: the settings are
    pinned again, and beginning and ending stay with the outer block.
    """
    status = conn.get_transaction_status()
    if status == psycopg2.extensions.TRANSACTION_STATUS_INTRANS:
        with conn.cursor() as cur:
            pin_settings(cur)
            yield cur
        return
    # Any other state (idle, or a lost connection) begins a transaction; a lost connection raises
    # psycopg2's own error here, which callers translate (and the control connection retries).
    autocommit = conn.autocommit
    conn.autocommit = False
    ok = False
    try:
        with conn.cursor() as cur:
            pin_settings(cur, readonly=readonly)
            yield cur
        ok = True
    finally:
        _finish(conn, commit=ok, autocommit=autocommit)


def _finish(conn: Any, *, commit: bool, autocommit: bool) -> None:
    if conn.closed:
        return
    try:
        if commit:
            conn.commit()  # an error here (a lost connection) propagates: the work is not known to be done
        else:
            with contextlib.suppress(psycopg2.Error):
                conn.rollback()
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg2.Error):
                conn.autocommit = autocommit
