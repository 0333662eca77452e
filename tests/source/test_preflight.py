"""Preflight checks (``run_checks``) against the real test server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pgpoll.errors import PublicationNotFoundError
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.preflight import FAIL, OK, WARN, CheckItem, run_checks


@pytest.fixture
def conn(db: Any) -> Iterator[Any]:
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


def test_run_checks_on_a_ready_server(db: Any, conn: Any) -> None:
    items = {i.name: i for i in run_checks(conn)}
    assert items["server version"].status == OK and items["server version"].value.startswith(str(db.major))
    assert (items["wal_level"].status, items["wal_level"].value) == (OK, "logical")
    assert items["free replication slots"].status == OK and items["free replication slots"].value.endswith("of 40")
    assert items["free wal senders"].value.endswith("of 20")
    assert items["role can use slots"] == CheckItem("role can use slots", OK, "postgres (superuser)")
    assert items["max_slot_wal_keep_size"].status == WARN
    assert not any(i.status == FAIL for i in items.values())


def test_free_slots_counts_existing_slots(db: Any, conn: Any) -> None:
    before = next(i for i in run_checks(conn) if i.name == "free replication slots").value
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (db.slot_name(),))
    after = next(i for i in run_checks(conn) if i.name == "free replication slots").value
    assert int(after.split()[0]) == int(before.split()[0]) - 1


def test_plugin_and_publication_checks(db: Any, conn: Any) -> None:
    items = run_checks(conn, plugin="pgoutput", publication="missing")
    assert items[-2] == CheckItem("plugin pgoutput", OK, "built in")
    assert items[-1].status == FAIL and items[-1].error is PublicationNotFoundError
    assert items[-1].as_json() == {"check": "publication missing", "status": "fail", "value": "missing",
                                   "fix": "create it: pgpoll publication create NAME --table schema.tbl"}
