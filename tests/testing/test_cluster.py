"""The throwaway-PostgreSQL harness: installations, cluster settings and failures, the ``db`` fixture."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from pgpoll.testing import prereqs
from pgpoll.testing.cluster import DEFAULT_SETTINGS, ThrowawayCluster, find_bindirs
from pgpoll.testing.pytest_plugin import _create_db, _drop_db


def test_find_bindirs_reports_each_major_version_once() -> None:
    found = find_bindirs()
    assert found, "no PostgreSQL installed: the harness cannot run"
    for major, inst in found.items():
        out = subprocess.run([str(inst.bindir / "postgres"), "--version"], capture_output=True, text=True).stdout
        assert inst.major == major and f" {inst.version}" in out


def test_prereqs_lists_the_servers_found(capsys: Any) -> None:
    assert prereqs.main() == 0
    out = capsys.readouterr().out
    for inst in find_bindirs().values():
        assert f"PostgreSQL {inst.version}: {inst.bindir}" in out


def test_dsn_quotes_user_password_and_database() -> None:
    inst = next(iter(find_bindirs().values()))
    cluster = ThrowawayCluster(inst, password="p@ss:/w rd", port=5999)
    assert cluster.dsn("my db") == "postgresql://postgres:p%40ss%3A%2Fw%20rd@127.0.0.1:5999/my%20db"
    assert cluster.dsn("d", user="u x", password="q") == "postgresql://u%20x:q@127.0.0.1:5999/d"
    assert cluster.dsn("d", user="nopw") == "postgresql://nopw@127.0.0.1:5999/d"


def test_start_failure_raises_with_the_server_log_and_removes_the_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    inst = find_bindirs().get(15) or next(iter(find_bindirs().values()))
    parent = Path(tempfile.mkdtemp(prefix="pgpoll-harness-test-"))
    parent.chmod(0o755)  # the server's OS user must reach the cluster directory
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    try:
        cluster = ThrowawayCluster(inst, settings={"shared_buffers": "'lots'"})
        with pytest.raises(RuntimeError) as caught:
            cluster.start()
        text = str(caught.value)
        assert "pg_ctl failed" in text and "shared_buffers" in text
        assert cluster.root is None and list(parent.iterdir()) == []
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_server_runs_with_the_default_settings(db: Any) -> None:
    for name in ("wal_level", "max_replication_slots", "max_wal_senders", "fsync", "listen_addresses"):
        value = db.execute("SELECT current_setting(%s)", (name,))[0][0]
        assert value == DEFAULT_SETTINGS[name].strip("'"), name


def test_tcp_logins_need_the_password(db: Any) -> None:
    with pytest.raises(psycopg2.OperationalError) as caught:
        psycopg2.connect(db.server.dsn(db.name, password=""), connect_timeout=5)
    assert "password" in str(caught.value)
    assert db.execute("SELECT 1") == [(1,)]


def test_db_fixture_gives_a_fresh_database_and_unique_valid_slot_names(db: Any) -> None:
    assert db.execute("SELECT current_database()") == [(db.name,)]
    assert db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]
    names = {db.slot_name() for _ in range(3)}
    assert len(names) == 3
    from pgpoll.source.names import check_slot_name

    assert all(check_slot_name(n) for n in names)


def test_drop_db_removes_its_slots_even_when_active(pg_server: Any) -> None:
    database = _create_db(pg_server)
    slot = database.slot_name()
    held = database.connect()
    with held.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', true)", (slot + "_tmp",))
    database.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    _drop_db(database)
    conn = psycopg2.connect(pg_server.dsn("postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s", (slot + "%",))
            assert cur.fetchone() == (0,)
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (database.name,))
            assert cur.fetchone() == (0,)
    finally:
        conn.close()


def test_restart_keeps_slots_and_serves_again(db: Any) -> None:
    slot = db.slot_name()
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.server.restart()
    assert db.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(slot,)]
