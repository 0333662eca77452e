"""Through a real PgBouncer, in session and in transaction mode, pgpoll reads exactly what a direct connection reads.

The database's own settings differ from every setting pgpoll pins (``TimeZone``,
``DateStyle``, ``IntervalStyle``, ``extra_float_digits``, ``bytea_output``), and a
client of the pooler leaves session-level ``SET``s behind on pooled server
connections: the peeked rows, the catalog, the slot commands and the control
connection must not notice, value for value, and must leave no session state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from pgpoll.lsn import Lsn
from pgpoll.source import slots
from pgpoll.source.catalog import catalog_table
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.control import ControlConnection
from pgpoll.source.server_state import read_server_state
from pgpoll.testing.pgbouncer import PgBouncer

DATABASE_SETTINGS = ("TimeZone = 'America/New_York'", "DateStyle = 'SQL, DMY'", "IntervalStyle = 'sql_standard'",
                     "extra_float_digits = 0", "bytea_output = 'escape'")

VALUES_TABLE = """
CREATE TABLE v (id int PRIMARY KEY, ts timestamptz, d date, iv interval, f8 float8, f4 real, b bytea,
                n numeric(10,2), t timestamp, tz timetz)
"""
VALUES_ROWS = [
    "(1, '2024-03-10 01:31:00+00', '2024-03-09', '1 day 02:03:04.5', 0.1, 1.1, '\\x00ff27', 1.5, "
    "'2024-03-09 20:31:00', '10:00:00+02')",
    "(2, '1999-12-31 23:59:59.999999+00', '2000-02-29', '-3 mons 4 days', 1e300, -0.000123, '', -0, "
    "'infinity', '00:00:00-11')",
]
CLEAN_ENV = {name: None for name in ("PGPOLL_DSN", "PGPOLL_DEBUG", "PGHOST", "PGPORT", "PGUSER", "PGPASSWORD",
                                     "PGDATABASE", "PGSERVICE", "PGPASSFILE", "PGOPTIONS")}


@pytest.fixture
def values_db(db: Any) -> Any:
    """``db`` with settings unlike pgpoll's, a table of setting-sensitive values and a publication."""
    for setting in DATABASE_SETTINGS:
        db.execute(f'ALTER DATABASE "{db.name}" SET {setting}')
    db.execute(VALUES_TABLE)
    db.execute("CREATE PUBLICATION pub FOR TABLE v")
    return db


POLLUTION = ("SET extra_float_digits = 3", "SET bytea_output = 'escape'", "SET IntervalStyle = 'iso_8601'",
             "SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'German'")


@pytest.fixture
def pooled(values_db: Any, pgbouncer: PgBouncer, pooled_dsn: str) -> Iterator[Any]:
    """A pgpoll connection through PgBouncer, after other clients left session-level SETs on the pool's connections."""
    pids = pgbouncer.fill_pool(values_db.name, POLLUTION)
    assert len(set(pids)) == pgbouncer.pool_size
    conn = connect(resolve_dsn(pooled_dsn))
    yield conn
    conn.close()


@pytest.fixture
def direct(values_db: Any) -> Iterator[Any]:
    conn = connect(resolve_dsn(values_db.dsn))
    yield conn
    conn.close()


def invoke(*args: str) -> Result:
    from pgpoll.cli.main import cli

    return CliRunner().invoke(cli, list(args), env=dict(CLEAN_ENV), catch_exceptions=False)


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_peek_through_the_pooler_reads_what_a_direct_connection_reads(
    values_db: Any, direct: Any, pooled: Any, plugin: str
) -> None:
    values_db.require_plugin(plugin)
    name = values_db.slot_name()
    slots.create_slot(direct, name, plugin)
    for row in VALUES_ROWS:
        values_db.execute(f"INSERT INTO v VALUES {row}")
    options = slots.peek_options(plugin, publications=["pub"])

    def peek(conn: Any) -> list[tuple[Lsn, Any, bytes]]:
        return [(lsn, xid, bytes(data)) for lsn, xid, data in slots.peek_rows(conn, name, plugin, options=options, raw_text=True)]

    expected = peek(direct)
    assert len(expected) >= 6  # two transactions: BEGIN, INSERT, COMMIT (+ pgoutput's RELATION)
    with direct.cursor() as cur:  # not vacuous: outside a pinned transaction the database's settings print otherwise
        cur.execute("SELECT ts::text, iv::text, b::text FROM v WHERE id = 1")
        assert cur.fetchone() == ("2024-03-09 20:31:00-05", "1 2:03:04.5", "\\000\\377'")
    for _ in range(3):  # transaction after transaction, on whichever server connection the pooler picks
        assert peek(pooled) == expected
    first_insert = next(data for _lsn, _xid, data in expected if b"2024" in data)
    for text in (b"2024-03-10 01:31:00+00", b"2024-03-09", b"1 day 02:03:04.5", b"0.1", b"1.1", b"\\x00ff27",
                 b"1.50", b"2024-03-09 20:31:00", b"10:00:00+02"):
        assert text in first_insert, (text, first_insert)


@pytest.mark.parametrize("pool_mode", ["transaction"])
def test_the_transaction_pooler_moves_a_client_between_server_connections(pooled: Any) -> None:
    # What makes the other tests meaningful: consecutive transactions of one client run on
    # different server connections, each with another client's SETs left behind.
    pids = set()
    for _ in range(8):
        with pooled.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pids.add(cur.fetchone()[0])
    assert len(pids) > 1


def test_catalog_reads_through_the_pooler_match(values_db: Any, direct: Any, pooled: Any) -> None:
    values_db.execute("CREATE DOMAIN money2 AS numeric(12,2)")
    values_db.execute("CREATE TABLE w (a int, b money2, c varchar(7), PRIMARY KEY (b, a))")
    for table in ("v", "w", "absent"):
        assert catalog_table(pooled, "public", table) == catalog_table(direct, "public", table)
    described = catalog_table(pooled, "public", "w")
    assert described is not None and described.key == ("b", "a")


def test_control_connection_and_server_state_through_the_pooler(
    values_db: Any, direct: Any, pooled: Any, pooled_dsn: str
) -> None:
    values_db.require_plugin("test_decoding")
    name = values_db.slot_name()
    slots.create_slot(direct, name, "test_decoding")
    control = ControlConnection(resolve_dsn(pooled_dsn), name)
    control.open()
    try:
        heartbeat = control.emit_heartbeat("run-1")
        assert control.slot_info().confirmed_flush_lsn < heartbeat
        assert control.advance(heartbeat).moved is True
        assert control.slot_info().confirmed_flush_lsn == heartbeat
        assert control.wal_lag() is not None
    finally:
        control.close()
    conn = connect(resolve_dsn(pooled_dsn))
    try:
        state = read_server_state(conn)
        assert state.database == values_db.name and [s.name for s in state.slots] == [name]
        assert state.server_time.utcoffset() is not None
    finally:
        conn.close()
    # No session state left anywhere: no advisory lock, nothing idle in a transaction.
    assert values_db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
    assert values_db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state LIKE 'idle in transaction%%'",
        (values_db.name,),
    ) == [(0,)]


def test_slot_commands_and_check_through_the_pooler(values_db: Any, pooled: Any, pooled_dsn: str) -> None:
    values_db.require_plugin("test_decoding")
    name = values_db.slot_name()
    assert invoke("check", "--plugin", "test_decoding", "--dsn", pooled_dsn).exit_code == 0
    created = invoke("slot", "create", name, "--plugin", "test_decoding", "--dsn", pooled_dsn)
    assert created.exit_code == 0, created.output
    for row in VALUES_ROWS:
        values_db.execute(f"INSERT INTO v VALUES {row}")
    listed = [json.loads(line) for line in invoke("slot", "list", "--json", "--dsn", pooled_dsn).stdout.splitlines()]
    assert [obj["slot"] for obj in listed if obj["database"] == values_db.name] == [name]
    via_pooler = invoke("slot", "peek", name, "--json", "--dsn", pooled_dsn)
    via_direct = invoke("slot", "peek", name, "--json", "--dsn", values_db.dsn)
    assert via_pooler.exit_code == 0 and via_pooler.stdout == via_direct.stdout
    assert "ts[timestamp with time zone]:'2024-03-10 01:31:00+00'" in via_pooler.stdout
    rows = [json.loads(line) for line in via_pooler.stdout.splitlines()]
    last_commit = rows[-1]["lsn"]
    advanced = invoke("slot", "advance", name, last_commit, "--dsn", pooled_dsn)
    assert advanced.exit_code == 0, advanced.output
    after = [json.loads(line) for line in invoke("slot", "peek", name, "--json", "--dsn", pooled_dsn).stdout.splitlines()]
    # the advance took every change; what may follow is an empty transaction of the server's own (an autoanalyze)
    assert [r for r in after if r["data"].startswith("table ")] == []
    dropped = invoke("slot", "drop", name, "--dsn", pooled_dsn)
    assert dropped.exit_code == 0, dropped.output
    assert values_db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (name,)) == [(0,)]


@pytest.fixture
def strict_bouncer(pg_server: Any) -> Iterator[PgBouncer]:
    """A PgBouncer that does not ignore libpq ``options``, with one server connection and a 2 s query_wait_timeout."""
    from pgpoll.testing.pgbouncer import find_pgbouncer

    if find_pgbouncer() is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run installs it)")
    bouncer = PgBouncer(pg_server, pool_mode="transaction", pool_size=1,
                        settings={"ignore_startup_parameters": "extra_float_digits", "query_wait_timeout": "2"}).start()
    yield bouncer
    bouncer.stop()


def test_a_pooler_refusing_libpq_options_fails_at_once_and_names_the_fix(db: Any, strict_bouncer: PgBouncer) -> None:
    from pgpoll.errors import ConnectionFailedError
    from pgpoll.source.server_errors import is_transient

    with pytest.raises(ConnectionFailedError) as caught:
        connect(resolve_dsn(strict_bouncer.dsn(db.name) + "?options=-csearch_path%3Dpublic"))
    assert "unsupported startup parameter" in caught.value.message
    assert "ignore_startup_parameters" in str(caught.value) and not is_transient(caught.value)
    conn = connect(resolve_dsn(strict_bouncer.dsn(db.name)))  # pgpoll itself sends no options
    conn.close()


def test_a_client_dropped_by_query_wait_timeout_is_a_lost_connection_retried_mid_run(
    db: Any, strict_bouncer: PgBouncer
) -> None:
    import psycopg2

    from pgpoll.source.server_errors import is_transient

    holder = psycopg2.connect(strict_bouncer.dsn(db.name))  # holds the pool's only server connection
    waiting = connect(resolve_dsn(strict_bouncer.dsn(db.name)))
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT 1")
        with pytest.raises(psycopg2.OperationalError) as caught, waiting.cursor() as cur:
            cur.execute("SELECT 2")
        assert is_transient(caught.value)
    finally:
        holder.close()
        waiting.close()
