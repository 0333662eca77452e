"""The snapshot preflight (``check_source``) against real servers: a hot standby and a lost slot.

A snapshot read on a hot standby cannot be matched with the change stream (its
snapshots list no running transaction), and a lost slot cannot give the changes
after a snapshot: both are refused with exit code 4. Both are proved on real
servers, not a fake connection: this module starts its own throwaway PG 15
primary and a ``pg_basebackup`` standby of it, and loses a slot on the primary
for real (``max_slot_wal_keep_size`` and WAL switched past it). They are its own
servers because the lost-slot test changes server settings the shared server's
other tests must not see.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pgpoll.cli.exitcodes import SOURCE, exit_code_for
from pgpoll.errors import SlotInvalidatedError, SlotNotFoundError, SourceError
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.snapshot.reads import check_source
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

VERSION = 15


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ThrowawayCluster, ThrowawayCluster]]:
    """A throwaway primary and a started hot standby of it (stopped at the end of the module)."""
    inst = find_bindirs().get(VERSION)
    if inst is None:
        pytest.skip(f"PostgreSQL {VERSION} is not installed here (set PGPOLL_TEST_PGBIN to its bindir)")
    primary = ThrowawayCluster(inst).start()
    try:
        standby = primary.standby()
        try:
            yield primary, standby
        finally:
            standby.stop()
    finally:
        primary.stop()


def _execute(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = connect(resolve_dsn(dsn), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def test_a_hot_standby_is_refused(servers: tuple[ThrowawayCluster, ThrowawayCluster]) -> None:
    primary, standby = servers
    _execute(primary.dsn(), "SELECT pg_create_logical_replication_slot('on_primary', 'pgoutput')")
    assert _execute(standby.dsn(), "SELECT pg_is_in_recovery()") == [(True,)]
    # PG 15 has no logical slots on a standby and slots are not replicated: the slot is missing there,
    # so the refusal must be the standby's, checked before the slot's.
    assert _execute(standby.dsn(), "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    conn = connect(resolve_dsn(standby.dsn()))
    try:
        with pytest.raises(SourceError, match="hot standby") as caught:
            check_source(conn, "on_primary")
    finally:
        conn.close()
    err = caught.value
    assert not isinstance(err, SlotNotFoundError)
    assert "run the snapshot with --dsn of the primary" in str(err) and "Capture from a standby" in str(err)
    assert exit_code_for(err) == SOURCE
    # the same slot on the primary passes
    conn = connect(resolve_dsn(primary.dsn()))
    try:
        assert check_source(conn, "on_primary").plugin == "pgoutput"
    finally:
        conn.close()


def test_a_lost_slot_is_refused(servers: tuple[ThrowawayCluster, ThrowawayCluster]) -> None:
    primary, _ = servers
    dsn = primary.dsn()
    _execute(dsn, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    _execute(dsn, "ALTER SYSTEM SET wal_keep_size = 0")
    _execute(dsn, "SELECT pg_reload_conf()")
    try:
        _execute(dsn, "SELECT pg_create_logical_replication_slot('to_lose', 'pgoutput')")
        _execute(dsn, "CREATE TABLE filler (x text)")
        status = ""
        for _ in range(8):  # WAL written and switched past the slot; a checkpoint invalidates it
            _execute(dsn, "INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 2000)")
            _execute(dsn, "SELECT pg_switch_wal()")
            _execute(dsn, "CHECKPOINT")
            status = _execute(dsn, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'to_lose'")[0][0]
            if status == "lost":
                break
        assert status == "lost"
    finally:
        _execute(dsn, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        _execute(dsn, "ALTER SYSTEM RESET wal_keep_size")
        _execute(dsn, "SELECT pg_reload_conf()")
    conn = connect(resolve_dsn(dsn))
    try:
        with pytest.raises(SlotInvalidatedError, match="lost") as caught:
            check_source(conn, "to_lose")
    finally:
        conn.close()
    assert "recreate the slot" in str(caught.value) and exit_code_for(caught.value) == SOURCE
