"""Slot access in the library: create, get, list, peek_rows, advance and plugin checks on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2.extensions
import pytest

from pgpoll.errors import ConfigError, SlotExistsError, SlotInvalidatedError, SlotNotFoundError, WrongPluginError
from pgpoll.lsn import Lsn
from pgpoll.source import slots
from pgpoll.source.connection import connect, resolve_dsn


@pytest.fixture
def conn(db: Any) -> Iterator[Any]:
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


@pytest.fixture
def td(db: Any, conn: Any) -> str:
    db.require_plugin("test_decoding")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    name: str = db.slot_name()
    slots.create_slot(conn, name, "test_decoding")
    db.execute("INSERT INTO t VALUES (1, 'a')")
    db.execute("INSERT INTO t VALUES (2, 'b')")
    return name


def test_create_slot_returns_its_row(db: Any, conn: Any) -> None:
    name = db.slot_name()
    info = slots.create_slot(conn, name, "pgoutput")
    assert (info.name, info.plugin, info.slot_type, info.database, info.active) == (name, "pgoutput", "logical", db.name, False)
    assert isinstance(info.confirmed_flush_lsn, Lsn) and isinstance(info.restart_lsn, Lsn)
    assert info.two_phase is False
    with pytest.raises(SlotExistsError):
        slots.create_slot(conn, name, "pgoutput")


def test_create_two_phase_slot(db: Any, conn: Any) -> None:
    assert slots.create_slot(conn, db.slot_name(), "pgoutput", two_phase=True).two_phase is True


def test_create_refuses_unknown_plugin_before_sql(conn: Any) -> None:
    with pytest.raises(ConfigError):
        slots.create_slot(conn, "fine_name", "wal2json")


def test_get_and_list_slots(db: Any, conn: Any, td: str) -> None:
    info = slots.get_slot(conn, td)
    assert info in slots.list_slots(conn)
    assert info.as_json()["confirmed_flush_lsn"] == str(info.confirmed_flush_lsn)
    with pytest.raises(SlotNotFoundError):
        slots.get_slot(conn, "absent_slot")


def test_peek_rows_yields_lsn_xid_and_text(db: Any, conn: Any, td: str) -> None:
    options = slots.peek_options("test_decoding")
    rows = list(slots.peek_rows(conn, td, "test_decoding", options=options))
    assert [type(v) for v in rows[0]] == [Lsn, int, str]
    rows = without_empty_transactions(rows)
    assert [r[2].split(" ")[0] for r in rows] == ["BEGIN", "table", "COMMIT", "BEGIN", "table", "COMMIT"]
    assert rows[0][1] != rows[3][1]  # two transactions, two xids
    assert conn.autocommit is True  # back in its old mode


def test_peek_rows_upto_nchanges_stops_on_a_transaction_boundary(db: Any, conn: Any, td: str) -> None:
    rows = list(slots.peek_rows(conn, td, "test_decoding", upto_nchanges=1, options=slots.peek_options("test_decoding")))
    kinds = [r[2].split(" ")[0] for r in rows]  # one whole transaction (an empty one of the server's counts too)
    assert kinds[0] == "BEGIN" and kinds[-1] == "COMMIT" and kinds.count("BEGIN") == 1 and len(kinds) <= 3, kinds


def without_empty_transactions(rows: list[tuple[Lsn, int, str]]) -> list[tuple[Lsn, int, str]]:
    """``rows`` without the transactions test_decoding prints empty (BEGIN then COMMIT): the server may commit
    one of its own in the test's database (an ANALYZE, a catalog change), which the peek shows like any other."""
    kept: list[tuple[Lsn, int, str]] = []
    for row in rows:
        if row[2].startswith("COMMIT") and kept and kept[-1][2].startswith("BEGIN"):
            kept.pop()
        else:
            kept.append(row)
    return kept


def test_peek_rows_stopped_early_leaves_the_connection_usable(db: Any, conn: Any, td: str) -> None:
    gen = slots.peek_rows(conn, td, "test_decoding", options=slots.peek_options("test_decoding"))
    next(gen)
    gen.close()
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert conn.autocommit is True
    assert slots.get_slot(conn, td).name == td


def test_peek_rows_pgoutput_yields_binary_rows(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute('CREATE PUBLICATION "a,b" FOR TABLE t')
    name = db.slot_name()
    slots.create_slot(conn, name, "pgoutput")
    db.execute("INSERT INTO t VALUES (1)")
    rows = list(slots.peek_rows(conn, name, "pgoutput", options=slots.peek_options("pgoutput", publications=["a,b"])))
    assert all(isinstance(r[2], (bytes, memoryview)) for r in rows)
    assert [bytes(r[2])[:1] for r in rows] == [b"B", b"R", b"I", b"C"]


def test_peek_options() -> None:
    assert slots.peek_options("pgoutput", publications=['x"y', "z"]) == [
        "proto_version", "1", "publication_names", '"x""y","z"', "messages", "true"]
    assert slots.peek_options("test_decoding")[:4] == ["include-xids", "1", "include-timestamp", "1"]
    with pytest.raises(ConfigError):
        slots.peek_options("pgoutput")


def test_advance_slot_results(db: Any, conn: Any, td: str) -> None:
    rows = list(slots.peek_rows(conn, td, "test_decoding", options=slots.peek_options("test_decoding")))
    # the COMMIT of id 1's transaction (by content, not position: the server may commit an empty transaction of
    # its own first, which test_decoding prints as BEGIN/COMMIT)
    first = next(i for i, r in enumerate(rows) if r[2] == "table public.t: INSERT: id[integer]:1 v[text]:'a'")
    first_commit = next(r[0] for r in rows[first:] if r[2].startswith("COMMIT"))
    start = slots.get_slot(conn, td).confirmed_flush_lsn
    moved = slots.advance_slot(conn, td, first_commit)
    assert moved == slots.AdvanceResult(td, first_commit, start, first_commit, True)
    again = slots.advance_slot(conn, td, first_commit)
    assert again == slots.AdvanceResult(td, first_commit, first_commit, first_commit, False)
    below = slots.advance_slot(conn, td, Lsn(int(first_commit) - 1))
    assert below.moved is False and below.after == first_commit
    # The first transaction is now skipped; the second still comes.
    left = list(slots.peek_rows(conn, td, "test_decoding", options=slots.peek_options("test_decoding")))
    assert [r[2] for r in left if r[2].startswith("table ")] == ["table public.t: INSERT: id[integer]:2 v[text]:'b'"]
    with pytest.raises(ConfigError):
        slots.advance_slot(conn, td, Lsn(0))


def test_check_plugin(db: Any, conn: Any, td: str) -> None:
    info = slots.get_slot(conn, td)
    assert slots.check_plugin(info, "auto") == "test_decoding"
    assert slots.check_plugin(info, "test_decoding") == "test_decoding"
    with pytest.raises(WrongPluginError) as caught:
        slots.check_plugin(info, "pgoutput")
    assert caught.value.message == f'slot "{td}" uses plugin test_decoding, not pgoutput'


def test_check_usable_refuses_a_lost_slot(db: Any, conn: Any, td: str) -> None:
    info = slots.get_slot(conn, td)
    assert slots.check_usable(info) is info
    lost = slots.SlotInfo(**{**info.__dict__, "wal_status": "lost"})
    with pytest.raises(SlotInvalidatedError):
        slots.check_usable(lost)


def test_drop_slot(db: Any, conn: Any, td: str) -> None:
    assert slots.drop_slot(conn, td) is True
    assert slots.drop_slot(conn, td, if_exists=True) is False
    with pytest.raises(SlotNotFoundError):
        slots.drop_slot(conn, td)


def test_catalog_read_in_the_middle_of_a_peek_joins_its_transaction(db: Any, conn: Any, td: str) -> None:
    from pgpoll.source.catalog import catalog_table

    gen = slots.peek_rows(conn, td, "test_decoding", options=slots.peek_options("test_decoding"), itersize=1)
    first = next(gen)
    described = catalog_table(conn, "public", "t")  # as the ingest task does for a table it meets
    assert described is not None and described.key == ("id",) and described.identity == "d"
    rest = list(gen)
    assert len([first, *rest]) == 6
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE and conn.autocommit is True


def test_safe_wal_size_shown(db: Any, conn: Any, td: str) -> None:
    info = slots.get_slot(conn, td)
    assert info.safe_wal_size is None and info.safe_wal_size_shown == "unlimited"
    lost = slots.SlotInfo(**{**info.__dict__, "wal_status": "lost"})
    assert lost.safe_wal_size_shown is None
    limited = slots.SlotInfo(**{**info.__dict__, "safe_wal_size": 1024})
    assert limited.safe_wal_size_shown == 1024


def test_peek_rows_reports_a_full_id_reference_newer_than_every_row(db: Any, conn: Any, td: str) -> None:
    last = int(db.execute("INSERT INTO t VALUES (3, 'c') RETURNING pg_current_xact_id()::text")[0][0])
    with conn.cursor() as cur:  # a session default that would freeze the snapshot before the peek
        cur.execute("SET default_transaction_isolation = 'repeatable read'")
    before = conn.isolation_level
    seen: list[int] = []
    rows = []
    for row in slots.peek_rows(conn, td, "test_decoding", options=slots.peek_options("test_decoding"),
                               itersize=1, on_xid_reference=seen.append):
        assert len(seen) == 1  # before the first row
        if not rows:
            with conn.cursor() as cur:
                cur.execute("SELECT current_setting('transaction_isolation')")
                assert cur.fetchone()[0] == "read committed"
        rows.append(row)
    [reference] = seen
    assert reference > last and all(xid is not None and xid < reference for _lsn, xid, _data in rows)
    assert conn.isolation_level == before and conn.autocommit is True
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
