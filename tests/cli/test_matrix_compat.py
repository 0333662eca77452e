"""Slot and publication commands on every PostgreSQL version of the matrix (``PGPOLL_TEST_PG``).

Small on purpose: it runs once per version. The full behaviour is pinned by the
other CLI tests on the primary version.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgpoll.lsn import Lsn


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_slot_lifecycle_create_list_peek_advance_drop(db_any: Any, pgpoll: Any, plugin: str) -> None:
    db_any.require_plugin(plugin)
    dsn = db_any.dsn
    db_any.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db_any.execute("CREATE PUBLICATION t_pub FOR TABLE t")
    name = db_any.slot_name()
    assert pgpoll("slot", "create", name, "--plugin", plugin, "--dsn", dsn).exit_code == 0
    db_any.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")

    (listed,) = [o for o in lines(pgpoll("slot", "list", "--json", "--dsn", dsn).stdout) if o["slot"] == name]
    assert listed["plugin"] == plugin and listed["wal_status"] == "reserved" and listed["lag_bytes"] > 0
    # the columns each version has (pgpoll.source.failover): failover and synced from 17, conflicting from 16
    assert (listed["failover"], listed["synced"], listed["sync_ready"], listed["invalidation_reason"]) == (
        (False, False, None, None) if db_any.major >= 17 else (None, None, None, None))
    assert listed["conflicting"] == (False if db_any.major >= 16 else None)

    peek_args = ["slot", "peek", name, "--json", "--dsn", dsn, "--publication", "t_pub"]
    if plugin == "test_decoding":
        peek_args = peek_args[:-2]
    first = pgpoll(*peek_args)
    assert first.exit_code == 0, first.output
    rows = lines(first.stdout)
    if plugin == "pgoutput":
        assert [bytes.fromhex(r["data_hex"])[:1] for r in rows] == [b"B", b"R", b"I", b"I", b"C"]
    else:
        assert [r["data"].split(" ")[0] for r in rows] == ["BEGIN", "table", "table", "COMMIT"]
    assert pgpoll(*peek_args).stdout == first.stdout  # peek never consumes

    commit = rows[-1]["lsn"]
    advanced = pgpoll("slot", "advance", name, commit, "--dsn", dsn)
    assert advanced.exit_code == 0 and advanced.stdout.strip().endswith(f"to {commit}")
    noop = pgpoll("slot", "advance", name, str(Lsn(int(Lsn.parse(commit)) - 1)), "--dsn", dsn)
    assert noop.exit_code == 0 and "nothing to do" in noop.stdout
    assert pgpoll(*peek_args).stdout == ""

    assert pgpoll("slot", "drop", name, "--dsn", dsn).exit_code == 0
    assert pgpoll("slot", "drop", name, "--dsn", dsn).exit_code == 4
    assert pgpoll("slot", "drop", name, "--if-exists", "--dsn", dsn).exit_code == 0


def test_publication_create_show_with_column_list_and_row_filter(db_any: Any, pgpoll: Any) -> None:
    db_any.execute('CREATE SCHEMA "Sch ""1"""')
    db_any.execute('CREATE TABLE "Sch ""1"""."Tab;le" (id int PRIMARY KEY, "Val ue" text, extra int)')
    spec = '"Sch ""1"""."Tab;le" (id, "Val ue") WHERE (id > 10)'
    created = pgpoll("publication", "create", 'P "x"', "--table", spec, "--publish", "insert,update", "--dsn", db_any.dsn)
    assert created.exit_code == 0, created.output
    info = json.loads(pgpoll("publication", "show", 'P "x"', "--json", "--dsn", db_any.dsn).stdout)
    assert info["publish"] == ["insert", "update"]
    assert info["tables"] == [{"schema": 'Sch "1"', "table": "Tab;le", "columns": ["id", "Val ue"], "row_filter": "(id > 10)"}]
    assert pgpoll("publication", "drop", 'P "x"', "--dsn", db_any.dsn).exit_code == 0


def test_check_exits_0_or_names_the_missing_plugin(db_any: Any, pgpoll: Any) -> None:
    result = pgpoll("check", "--json", "--plugin", "test_decoding", "--dsn", db_any.dsn)
    items = {i["check"]: i for i in lines(result.stdout)}
    assert items["wal_level"]["status"] == "ok"
    if "test_decoding" in db_any.plugins:
        assert result.exit_code == 0
        assert items["plugin test_decoding"]["status"] == "ok"
    else:
        assert result.exit_code == 4
        assert items["plugin test_decoding"]["status"] == "fail"
        assert 'could not access file "test_decoding"' in items["plugin test_decoding"]["value"]
        assert "error: 1 check(s) failed, first: plugin test_decoding is" in result.stderr
        create = pgpoll("slot", "create", db_any.slot_name(), "--plugin", "test_decoding", "--dsn", db_any.dsn)
        assert create.exit_code == 4
        assert 'could not access file "test_decoding"' in create.stderr
        assert "fix: the output plugin is not installed on the server" in create.stderr
