"""The control connection: no retry for a failure at start, logged retries for a connection lost mid-run, no lock."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg2
import pytest

from pgpoll.errors import ConnectionFailedError, SlotNotFoundError
from pgpoll.source import control as control_module
from pgpoll.source.connection import ConnectionTarget, resolve_dsn
from pgpoll.source.control import ControlConnection, retrying, transient_at_start

REFUSED = "postgresql://someone:pw-refused@127.0.0.1:1/db"


class FakeConn:
    """Enough of a psycopg2 connection for ``open()``'s round trip."""

    closed = False

    def close(self) -> None:
        self.closed = True

    def cursor(self) -> FakeConn:
        return self

    def __enter__(self) -> FakeConn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, query: str) -> None:
        assert query == "SELECT 1"


def test_refused_at_start_fails_at_once_without_retrying(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgpoll")
    control = ControlConnection(resolve_dsn(REFUSED), "s")
    started = time.monotonic()
    with pytest.raises(ConnectionFailedError) as caught:
        control.open()
    assert time.monotonic() - started < 5
    assert "Connection refused" in caught.value.message and "pw-refused" not in str(caught.value)
    assert not caplog.records


@pytest.mark.parametrize(
    ("sqlstate", "retried"),
    [("57P03", True), ("53300", True), ("08001", False), ("28P01", False), ("3D000", False), (None, False)],
)
def test_only_a_server_starting_up_or_full_is_retried_at_start(sqlstate: str | None, retried: bool) -> None:
    assert transient_at_start(ConnectionFailedError("x", sqlstate=sqlstate)) is retried


def test_start_retries_a_server_starting_up_and_logs_each_retry(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgpoll")
    calls: list[int] = []

    def fake_connect(target: ConnectionTarget, **kwargs: Any) -> FakeConn:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionFailedError("cannot connect: the database system is starting up", sqlstate="57P03")
        return FakeConn()

    monkeypatch.setattr(control_module, "connect", fake_connect)
    control = ControlConnection(ConnectionTarget("", "test"), "s")
    control.open()
    assert len(calls) == 2 and isinstance(control.conn, FakeConn)
    [record] = caplog.records
    assert record.name == "pgpoll"
    assert record.getMessage() == (
        "connecting to the server failed (attempt 1): cannot connect: the database system is starting up; retrying in 0.5 s"
    )


def test_a_connection_lost_mid_run_is_reopened_and_each_retry_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgpoll")
    opened: list[FakeConn] = []

    def fake_connect(target: ConnectionTarget, **kwargs: Any) -> FakeConn:
        opened.append(FakeConn())
        return opened[-1]

    monkeypatch.setattr(control_module, "connect", fake_connect)
    control = ControlConnection(ConnectionTarget("", "test"), "s1")
    control.open()
    failures = [psycopg2.OperationalError("server closed the connection unexpectedly\nmore"), None]

    def work(conn: Any) -> str:
        error = failures.pop(0)
        if error is not None:
            raise error
        return "done"

    assert control.call(work) == "done"
    assert len(opened) == 2 and opened[0].closed  # the lost connection was closed, a new one opened
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "control connection of slot s1 failed (attempt 1): server closed the connection unexpectedly; retrying in 0.5 s"
    ]


def test_a_permanent_error_mid_run_is_not_retried(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(control_module, "connect", lambda target, **kwargs: FakeConn())
    control = ControlConnection(ConnectionTarget("", "test"), "s")
    calls: list[int] = []

    def work(conn: Any) -> None:
        calls.append(1)
        raise SlotNotFoundError("gone")

    with pytest.raises(SlotNotFoundError):
        control.call(work)
    assert calls == [1] and not caplog.records


def test_retrying_gives_up_after_its_attempts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgpoll")
    with pytest.raises(ConnectionFailedError):
        for attempt in retrying(attempts=2, what="batch"):
            with attempt:
                raise ConnectionFailedError("lost the connection", sqlstate="57P01")
    assert [r.getMessage() for r in caplog.records] == ["batch failed (attempt 1): lost the connection; retrying in 0.5 s"]


def test_the_control_connection_takes_no_lock(db: Any) -> None:
    db.require_plugin("test_decoding")
    name = db.slot_name()
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (name,))
    first, second = ControlConnection(resolve_dsn(db.dsn), name), ControlConnection(resolve_dsn(db.dsn), name)
    first.open()
    second.open()  # no advisory lock: the fence is the output's commit log
    try:
        lsn = first.emit_heartbeat("run")
        assert second.advance(lsn).after == lsn
        assert first.slot_info().confirmed_flush_lsn == lsn
        assert db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("dsn", [REFUSED, "postgresql://u:pw-dns@no-such-host.invalid/db"])
def test_ingest_fails_at_once_with_exit_4_when_it_cannot_connect_at_start(
    dsn: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from click.testing import CliRunner

    from pgpoll.cli.main import cli

    caplog.set_level(logging.WARNING, logger="pgpoll")
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["ingest", "--slot", "s", "--output", str(tmp_path / "out"), "--dsn", dsn],
                                env={"PGPOLL_DSN": None, "PGPOLL_DEBUG": None})
    assert result.exit_code == 4, result.output
    assert time.monotonic() - started < 10
    assert "error: cannot connect to" in result.output and "fix: check the host" in result.output
    assert "pw-" not in result.output
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
