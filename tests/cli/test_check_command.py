"""``pgpoll check``: the preflight table, its JSON form, and the failures that exit 4 with the fix."""

from __future__ import annotations

import json
from typing import Any

from pgpoll.source.slot_copies import copy_check

CHECK_NAMES = ["server version", "wal_level", "free replication slots", "free wal senders",
               "role can use slots", "max_slot_wal_keep_size"]


def test_check_ready_server_exits_0_with_every_check(db: Any, pgpoll: Any) -> None:
    result = pgpoll("check", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("server: postgresql://postgres:***@127.0.0.1:")
    assert lines[1].split() == ["check", "status", "value", "fix"]
    assert [line[: len(name)] for line, name in zip(lines[2:], CHECK_NAMES, strict=False)] == CHECK_NAMES
    assert "wal_level               ok      logical" in result.stdout
    assert "postgres (superuser)" in result.stdout
    assert result.stderr == ""


def test_check_json_prints_one_object_per_check(db: Any, pgpoll: Any) -> None:
    result = pgpoll("check", "--json", "--plugin", "pgoutput", "--dsn", db.dsn)
    assert result.exit_code == 0
    items = [json.loads(line) for line in result.stdout.splitlines()]
    assert [i["check"] for i in items] == [*CHECK_NAMES, "plugin pgoutput", "timeline history", "decode copies"]
    assert all(set(i) == {"check", "status", "value", "fix"} for i in items)
    assert {i["check"]: i["status"] for i in items}["wal_level"] == "ok"
    keep = next(i for i in items if i["check"] == "max_slot_wal_keep_size")
    assert (keep["status"], keep["value"]) == ("warn", "-1")
    assert "a stalled slot can fill the disk" in keep["fix"]
    assert items[-2] == {"check": "timeline history", "status": "ok", "value": "readable", "fix": ""}  # a superuser


def test_check_says_how_many_temporary_copies_an_ingest_run_uses(db: Any, pgpoll: Any) -> None:
    def copies(*args: str) -> dict[str, str]:
        result = pgpoll("check", "--json", "--dsn", db.dsn, *args)
        assert result.exit_code == 0, result.output
        return next(i for i in map(json.loads, result.stdout.splitlines()) if i["check"] == "decode copies")

    free = db.execute("SELECT current_setting('max_replication_slots')::int - count(*)::int FROM pg_replication_slots")[0][0]
    item = copies("--decode-parallelism", "3")
    assert (item["status"], item["value"].split(" (")[0]) == ("ok", "2 per batch over 32 MiB of WAL")
    assert f"{free} of max_replication_slots" in item["value"]
    assert copies("--decode-parallelism", "1")["value"].startswith("none (--decode-parallelism 1")
    short = copies("--decode-parallelism", str(free + 3))  # more than the server has free: fewer, and the fix says so
    # copies leave one free slot for others
    assert (short["status"], short["value"].split(" (")[0]) == ("warn", f"{free - 1} per batch over 32 MiB of WAL")
    assert "raise max_replication_slots by 3" in short["fix"]
    default = copies()  # no option: the default's one copy, a speed-up, so never a warning
    assert (default["status"], default["value"].split(" (")[0]) == ("ok", "1 per batch over 32 MiB of WAL")
    conn = db.connect()
    try:  # the default asking for more copies than the server has free: said, not warned about
        unasked = copy_check(conn, None, free + 3, asked=False)
    finally:
        conn.close()
    assert unasked.status == "ok" and "fewer than the default --decode-parallelism" in unasked.value
    assert "raise max_replication_slots by 3" in unasked.value


def test_check_plugin_probe_reports_available_and_leaves_no_slot(db: Any, pgpoll: Any) -> None:
    db.require_plugin("test_decoding")
    result = pgpoll("check", "--json", "--plugin", "test_decoding", "--dsn", db.dsn)
    assert result.exit_code == 0
    probe = next(json.loads(r) for r in result.stdout.splitlines() if '"plugin test_decoding"' in r)
    assert probe == {"check": "plugin test_decoding", "status": "ok", "value": "available", "fix": ""}
    assert db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgpoll_check_probe%%'") == [(0,)]


def test_check_role_without_replication_exits_4_naming_the_fix(db: Any, pgpoll: Any, make_role: Any) -> None:
    role = make_role()
    result = pgpoll("check", "--dsn", role.dsn)
    assert result.exit_code == 4
    assert f"role can use slots      fail    {role.name} (no REPLICATION)" in result.stdout
    assert "error: 1 check(s) failed, first: role can use slots is " in result.stderr
    assert f"fix: as a superuser: ALTER ROLE {role.name} REPLICATION (see sql/least_privilege.sql)" in result.stderr
    assert role.password not in result.output


def test_check_role_with_replication_exits_0(db: Any, pgpoll: Any, make_role: Any) -> None:
    role = make_role("REPLICATION")
    result = pgpoll("check", "--plugin", "pgoutput", "--dsn", role.dsn)
    assert result.exit_code == 0, result.output
    assert f"{role.name} (replication)" in result.stdout


def test_check_missing_publication_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("check", "--publication", "nope", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert "publication nope        fail    missing" in result.stdout
    assert "error: 1 check(s) failed, first: publication nope is missing" in result.stderr
    assert "fix: create it: pgpoll publication create NAME --table schema.tbl" in result.stderr


def test_check_existing_publication_passes(db: Any, pgpoll: Any) -> None:
    db.execute('CREATE PUBLICATION "Odd Pub" FOR ALL TABLES')
    result = pgpoll("check", "--json", "--publication", "Odd Pub", "--dsn", db.dsn)
    assert result.exit_code == 0
    assert next(json.loads(r) for r in result.stdout.splitlines() if '"publication Odd Pub"' in r) == {
        "check": "publication Odd Pub", "status": "ok", "value": "exists", "fix": ""}
