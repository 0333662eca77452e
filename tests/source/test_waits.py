"""A server call that waits says so: the slot creation blocked by another session's open transaction (PostgreSQL 15).

A new slot's first snapshot waits for every transaction running when the
creation began (``SnapBuildWaitSnapshot``: a lock wait on each transaction id),
so an idle-in-transaction session holds ``pgpoll slot create`` until it ends.
The wait watch (:mod:`pgpoll.source.waits`) must name that session within 10 s,
also behind a transaction pooler, where only the pid taken in the creation's
own transaction names the right server backend (the PostgreSQL 17 tests in
``tests/cli/test_failover.py`` watch direct connections).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import psycopg2
import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.source.failover import standby_slot_names
from pgpoll.source.waits import STANDBY_WAIT, Activity, CallWatch


@pytest.mark.parametrize("pool_mode", ["transaction"])
def test_slot_creation_blocked_by_an_open_transaction_names_the_session_within_10_s(db: Any, pooled_dsn: str) -> None:
    blocker = db.connect(autocommit=False, application_name="old-report-job")
    with blocker.cursor() as cur:
        cur.execute("SELECT pg_backend_pid(), txid_current()")  # an xid: the new slot must see it end
        blocker_pid = cur.fetchone()[0]
    release = threading.Timer(12.0, blocker.rollback)
    release.start()
    started = time.monotonic()
    try:
        result = CliRunner().invoke(cli, ["slot", "create", db.slot_name("blocked"), "--plugin", "test_decoding",
                                          "--dsn", pooled_dsn])
    finally:
        release.cancel()
        blocker.close()
    took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert took >= 11, "the creation did not wait for the open transaction"
    assert "created slot" in result.stdout
    lines = [line for line in result.stderr.splitlines() if "waiting on the server" in line]
    assert lines, result.stderr
    first = lines[0]
    waited = int(re.search(r"waiting on the server for (\d+) s", first).group(1))  # type: ignore[union-attr]
    assert waited <= 10
    assert f"pid {blocker_pid}" in first and "application_name 'old-report-job'" in first
    assert "idle in transaction" in first and "ShareLock lock on transactionid" in first
    assert db.server.password not in result.output


def test_standby_slot_names_split_like_the_server() -> None:
    assert standby_slot_names("") == []
    assert standby_slot_names("sb_slot") == ["sb_slot"]
    assert standby_slot_names(' SB1 , "Mixed ""q"" name",sb3 ') == ["sb1", 'Mixed "q" name', "sb3"]


def test_a_cancel_that_fails_sets_no_standby_verdict(db: Any) -> None:
    """The standby-wait verdict (what :func:`~pgpoll.source.waits.watched` raises instead of the call's error) is
    set only once ``pg_cancel_backend`` cancelled: after a cancel that raised or found no backend, the call's
    next error, unrelated, must stay itself."""
    from pgpoll.source.connection import resolve_dsn

    watch = CallWatch(resolve_dsn(db.dsn), 'the peek of slot "s"', report=lambda _line: None)
    watch._pid = 2**31 - 1  # no backend has it: the server cancels nothing (false, and a WARNING)
    stuck = Activity("active", "Client", STANDBY_WAIT, 61.0)
    conn = db.connect()
    cur = conn.cursor()
    assert watch._cancel(cur, stuck, "sb", 'slot "sb" is missing') is False
    assert watch.verdict is None
    conn.close()
    with pytest.raises(psycopg2.InterfaceError):  # the cancel itself fails (its connection is gone)
        watch._cancel(cur, stuck, "sb", 'slot "sb" is missing')
    assert watch.verdict is None
