"""``pgpoll slot``: create, drop, list, peek and advance against a real server, with every error path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgpoll.lsn import Lsn

INVALID_SLOT_NAMES = [
    ("Upper", "lower-case letters, digits and underscores"),
    ("da-sh", "lower-case letters, digits and underscores"),
    ("sp ace", "lower-case letters, digits and underscores"),
    ("slöt", "lower-case letters, digits and underscores"),
    ("x" * 64, "at most 63"),
    ("", "lower-case letters, digits and underscores"),
]


def slot_row(db: Any, name: str) -> dict[str, Any]:
    rows = db.execute(
        "SELECT plugin, active, restart_lsn::text, confirmed_flush_lsn::text, wal_status, database "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    )
    assert rows, f"slot {name} does not exist"
    keys = ("plugin", "active", "restart_lsn", "confirmed_flush_lsn", "wal_status", "database")
    return dict(zip(keys, rows[0], strict=True))


def slot_exists(db: Any, name: str) -> bool:
    return bool(db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (name,)))


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def td_slot(db: Any, pgpoll: Any) -> str:
    """A test_decoding slot created through the CLI, then one transaction of three INSERTs."""
    db.require_plugin("test_decoding")
    name: str = db.slot_name()
    db.execute("CREATE TABLE items (id int PRIMARY KEY, label text)")
    result = pgpoll("slot", "create", name, "--plugin", "test_decoding", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    db.execute("INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')")
    return name


def test_create_prints_name_plugin_and_position(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    assert result.exit_code == 0
    row = slot_row(db, name)
    assert row["plugin"] == "pgoutput" and row["database"] == db.name
    assert result.stdout.strip() == f"created slot {name} (plugin pgoutput) at {row['confirmed_flush_lsn']}"


def test_create_duplicate_exits_4_saying_it_exists(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    assert pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn).exit_code == 0
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert f'replication slot "{name}" already exists' in result.stderr
    assert "fix: choose another name, or drop the old slot" in result.stderr


def test_create_unknown_plugin_exits_2(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "create", db.slot_name(), "--plugin", "wal2json", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "'wal2json' is not one of 'test_decoding', 'pgoutput'" in result.stderr


@pytest.mark.parametrize("command", [["create", "{name}", "--plugin", "pgoutput"], ["drop", "{name}"],
                                     ["peek", "{name}"], ["advance", "{name}", "0/1"]])
@pytest.mark.parametrize(("bad_name", "rule"), INVALID_SLOT_NAMES, ids=["upper", "dash", "space", "unicode", "long", "empty"])
def test_invalid_slot_name_exits_2_stating_the_rule(pgpoll: Any, command: list[str], bad_name: str, rule: str) -> None:
    # No server is needed: the name is refused before any connection is made.
    args = [part.replace("{name}", bad_name) for part in command]
    result = pgpoll("slot", *args, "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert result.exit_code == 2
    assert "error: slot name" in result.stderr
    assert rule in result.stderr


def test_invalid_slot_name_creates_nothing(db: Any, pgpoll: Any) -> None:
    before = db.execute("SELECT count(*) FROM pg_replication_slots")[0][0]
    result = pgpoll("slot", "create", "Bad_Name", "--plugin", "pgoutput", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert db.execute("SELECT count(*) FROM pg_replication_slots")[0][0] == before


def test_create_accepts_a_63_byte_name(db: Any, pgpoll: Any) -> None:
    name = ("z" + db.name + "_" * 63)[:63]
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    assert slot_exists(db, name)


def test_drop_removes_the_slot(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    result = pgpoll("slot", "drop", name, "--dsn", db.dsn)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dropped slot {name}"
    assert not slot_exists(db, name)


def test_drop_missing_slot_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "drop", "no_such_slot", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'replication slot "no_such_slot" does not exist' in result.stderr
    assert "--if-exists" in result.stderr


def test_drop_missing_slot_with_if_exists_exits_0(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "drop", "no_such_slot", "--if-exists", "--dsn", db.dsn)
    assert result.exit_code == 0
    assert result.stdout.strip() == "slot no_such_slot does not exist; nothing to do"


def test_list_table_shows_plugin_active_lsns_wal_status_lag_and_safe_wal_size(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "list", "--dsn", db.dsn)
    assert result.exit_code == 0
    header, *rows = result.stdout.splitlines()
    failover = ["failover", "synced", "sync_ready"] if db.major >= 17 else []  # PostgreSQL 17+ only
    assert header.split() == ["slot", "plugin", "database", "active", "restart_lsn", "confirmed_lsn",
                              "wal_status", "lag_bytes", "safe_wal_size", *failover, "invalidated"]
    mine = [r.split() for r in rows if r.split()[0] == td_slot]
    assert len(mine) == 1
    server = slot_row(db, td_slot)
    cells = mine[0]
    assert cells[1:7] == ["test_decoding", db.name, "no", server["restart_lsn"], server["confirmed_flush_lsn"], "reserved"]
    assert int(cells[7]) > 0  # the INSERT is behind the slot
    assert cells[8] == "unlimited"  # max_slot_wal_keep_size = -1 on the test server


def test_list_json_matches_the_server(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "list", "--json", "--dsn", db.dsn)
    assert result.exit_code == 0
    mine = [obj for obj in json_lines(result.stdout) if obj["slot"] == td_slot]
    assert len(mine) == 1
    obj = mine[0]
    server = slot_row(db, td_slot)
    assert obj["plugin"] == "test_decoding" and obj["active"] is False and obj["database"] == db.name
    assert obj["restart_lsn"] == server["restart_lsn"]
    assert obj["confirmed_flush_lsn"] == server["confirmed_flush_lsn"]
    assert obj["wal_status"] == "reserved"
    assert obj["safe_wal_size"] is None
    lag_now = db.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", (server["confirmed_flush_lsn"],))
    assert 0 < obj["lag_bytes"] <= lag_now[0][0]


def test_list_lag_bytes_grows_with_new_wal(db: Any, pgpoll: Any, td_slot: str) -> None:
    def lag() -> int:
        objs = json_lines(pgpoll("slot", "list", "--json", "--dsn", db.dsn).stdout)
        return int(next(o["lag_bytes"] for o in objs if o["slot"] == td_slot))

    before = lag()
    db.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(10, 200) g")
    assert lag() > before


def test_peek_json_test_decoding_prints_lsn_xid_data(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "peek", td_slot, "--json", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert all(set(r) == {"lsn", "xid", "data"} for r in rows)
    assert all(str(Lsn.parse(r["lsn"])) == r["lsn"] for r in rows)
    xid = rows[0]["xid"]
    assert isinstance(xid, int) and all(r["xid"] == xid for r in rows)
    assert rows[0]["data"] == f"BEGIN {xid}"
    assert rows[1]["data"] == "table public.items: INSERT: id[integer]:1 label[text]:'one'"
    assert rows[-1]["data"].startswith(f"COMMIT {xid} (at ")
    assert len(rows) == 5


def test_peek_text_prints_lsn_tab_xid_tab_data(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "peek", td_slot, "--dsn", db.dsn)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    lsn, xid, data = lines[1].split("\t")
    Lsn.parse(lsn)
    assert data == "table public.items: INSERT: id[integer]:1 label[text]:'one'"
    assert lines[0] == f"{lines[0].split(chr(9))[0]}\t{xid}\tBEGIN {xid}"


def test_peek_never_consumes(db: Any, pgpoll: Any, td_slot: str) -> None:
    before = slot_row(db, td_slot)
    first = pgpoll("slot", "peek", td_slot, "--json", "--dsn", db.dsn)
    second = pgpoll("slot", "peek", td_slot, "--json", "--dsn", db.dsn)
    assert first.exit_code == second.exit_code == 0
    assert first.stdout == second.stdout and len(json_lines(first.stdout)) == 5
    after = slot_row(db, td_slot)
    assert after["confirmed_flush_lsn"] == before["confirmed_flush_lsn"]
    # restart_lsn is the server's bookkeeping, not consumption: decoding a running-xacts record at or before
    # confirmed_flush moves it at once, a peek included (LogicalIncreaseRestartDecodingForSlot, logical.c)
    assert Lsn.parse(before["restart_lsn"]) <= Lsn.parse(after["restart_lsn"]) <= Lsn.parse(after["confirmed_flush_lsn"])


def test_peek_limit_prints_at_most_n_rows(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "peek", td_slot, "--json", "--limit", "2", "--dsn", db.dsn)
    assert result.exit_code == 0
    rows = json_lines(result.stdout)
    assert [r["data"].split()[0] for r in rows] == ["BEGIN", "table"]


def test_peek_limit_below_1_exits_2(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "peek", td_slot, "--limit", "0", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "0 is not in the range x>=1" in result.stderr


def test_peek_empty_slot_prints_nothing_and_exits_0(db: Any, pgpoll: Any) -> None:
    db.require_plugin("test_decoding")
    name = db.slot_name()
    pgpoll("slot", "create", name, "--plugin", "test_decoding", "--dsn", db.dsn)
    result = pgpoll("slot", "peek", name, "--dsn", db.dsn)
    assert result.exit_code == 0 and result.stdout == ""


def test_peek_json_pgoutput_prints_lsn_xid_data_hex(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    db.execute("CREATE TABLE items (id int PRIMARY KEY, label text)")
    db.execute("CREATE PUBLICATION items_pub FOR TABLE items")
    assert pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn).exit_code == 0
    db.execute("INSERT INTO items VALUES (1, 'one')")
    result = pgpoll("slot", "peek", name, "--json", "--publication", "items_pub", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    rows = json_lines(result.stdout)
    assert all(set(r) == {"lsn", "xid", "data_hex"} for r in rows)
    kinds = [bytes.fromhex(r["data_hex"])[:1] for r in rows]
    assert kinds == [b"B", b"R", b"I", b"C"]
    assert b"one" in bytes.fromhex(rows[2]["data_hex"])
    assert len({r["xid"] for r in rows}) == 1 and isinstance(rows[0]["xid"], int)


def test_peek_pgoutput_text_prints_message_type_and_hex(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION items_pub FOR TABLE items")
    pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    db.execute("INSERT INTO items VALUES (1)")
    result = pgpoll("slot", "peek", name, "--publication", "items_pub", "--dsn", db.dsn)
    assert result.exit_code == 0
    data = [line.split("\t")[2] for line in result.stdout.splitlines()]
    assert [d.split(" ")[0] for d in data] == ["B", "R", "I", "C"]
    assert data[2].split(" ")[1].startswith("49")  # 'I' in hex


def test_peek_pgoutput_without_publication_exits_2(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    result = pgpoll("slot", "peek", name, "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "slot uses pgoutput, which needs a publication" in result.stderr
    assert "fix: pass --publication NAME" in result.stderr


def test_peek_missing_publication_exits_4(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    result = pgpoll("slot", "peek", name, "--publication", "nope_pub", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'publication "nope_pub" does not exist' in result.stderr
    assert "pgpoll publication create" in result.stderr


def test_peek_missing_slot_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "peek", "no_such_slot", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'replication slot "no_such_slot" does not exist' in result.stderr
    assert "fix: create it with: pgpoll slot create no_such_slot" in result.stderr


def test_peek_physical_slot_exits_4_wrong_plugin(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    db.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
    result = pgpoll("slot", "peek", name, "--dsn", db.dsn)
    assert result.exit_code == 4
    assert f'slot "{name}" is a physical slot' in result.stderr
    assert "create a logical slot" in result.stderr


def test_peek_slot_of_another_database_exits_4_naming_it(db: Any, pgpoll: Any, td_slot: str) -> None:
    other = db.server.dsn("postgres")
    result = pgpoll("slot", "peek", td_slot, "--dsn", other)
    assert result.exit_code == 4
    assert "was not created in this database" in result.stderr
    assert "connect to the slot's database" in result.stderr


def test_peek_busy_slot_exits_3(db: Any, pgpoll: Any, td_slot: str, hold_slot: Any) -> None:
    pid = hold_slot(td_slot)
    result = pgpoll("slot", "peek", td_slot, "--dsn", db.dsn)
    assert result.exit_code == 3
    message = f'error: slot {td_slot} is in use by another consumer: replication slot "{td_slot}" is active for PID {pid}'
    assert message in result.stderr
    assert "fix: wait for the other run to finish" in result.stderr


def test_advance_busy_slot_exits_3(db: Any, pgpoll: Any, td_slot: str, hold_slot: Any) -> None:
    pid = hold_slot(td_slot)
    result = pgpoll("slot", "advance", td_slot, "FFFFFFFF/0", "--dsn", db.dsn)
    assert result.exit_code == 3
    assert f"is active for PID {pid}" in result.stderr


def test_drop_busy_slot_exits_3_and_keeps_it(db: Any, pgpoll: Any, td_slot: str, hold_slot: Any) -> None:
    hold_slot(td_slot)
    result = pgpoll("slot", "drop", td_slot, "--dsn", db.dsn)
    assert result.exit_code == 3
    assert "is in use by another consumer" in result.stderr
    assert slot_exists(db, td_slot)


def last_commit_lsn(pgpoll: Any, db: Any, slot: str) -> str:
    rows = json_lines(pgpoll("slot", "peek", slot, "--json", "--dsn", db.dsn).stdout)
    commits = [r["lsn"] for r in rows if r["data"].startswith("COMMIT")]
    return str(commits[-1])


def test_advance_to_commit_lsn_moves_the_slot_past_that_transaction(db: Any, pgpoll: Any, td_slot: str) -> None:
    before = slot_row(db, td_slot)["confirmed_flush_lsn"]
    commit = last_commit_lsn(pgpoll, db, td_slot)
    result = pgpoll("slot", "advance", td_slot, commit, "--dsn", db.dsn)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"advanced slot {td_slot} from {before} to {commit}"
    assert slot_row(db, td_slot)["confirmed_flush_lsn"] == commit
    assert pgpoll("slot", "peek", td_slot, "--dsn", db.dsn).stdout == ""
    db.execute("INSERT INTO items VALUES (4, 'four')")
    rows = json_lines(pgpoll("slot", "peek", td_slot, "--json", "--dsn", db.dsn).stdout)
    assert [r["data"] for r in rows if r["data"].startswith("table ")] == [
        "table public.items: INSERT: id[integer]:4 label[text]:'four'"]


@pytest.mark.parametrize("where", ["equal", "below"])
def test_advance_at_or_below_confirmed_flush_is_a_noop_exit_0(db: Any, pgpoll: Any, td_slot: str, where: str) -> None:
    created_at = slot_row(db, td_slot)["confirmed_flush_lsn"]
    commit = last_commit_lsn(pgpoll, db, td_slot)
    assert pgpoll("slot", "advance", td_slot, commit, "--dsn", db.dsn).exit_code == 0
    target = commit if where == "equal" else created_at
    result = pgpoll("slot", "advance", td_slot, target, "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"slot {td_slot} is already at {commit}; nothing to do"
    assert result.stderr == ""
    assert slot_row(db, td_slot)["confirmed_flush_lsn"] == commit


def test_advance_beyond_the_end_of_wal_is_clamped(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "advance", td_slot, "FFFFFFFF/FFFFFFFF", "--dsn", db.dsn)
    assert result.exit_code == 0
    confirmed = Lsn.parse(slot_row(db, td_slot)["confirmed_flush_lsn"])
    assert confirmed <= Lsn.parse(db.execute("SELECT pg_current_wal_lsn()::text")[0][0])
    assert result.stdout.strip().endswith(f"to {confirmed}")


def test_advance_bad_lsn_text_exits_2(db: Any, pgpoll: Any, td_slot: str) -> None:
    before = slot_row(db, td_slot)["confirmed_flush_lsn"]
    for bad in ["zzz", "0/G", "1/2/3", "-1/0", "123456789/0", "0x10", ""]:
        result = pgpoll("slot", "advance", "--dsn", db.dsn, td_slot, "--", bad)
        assert result.exit_code == 2, bad
        assert f"error: {bad!r} is not an LSN" in result.stderr
        assert "fix: write it as PostgreSQL prints it, e.g. 0/16B1970" in result.stderr
    assert slot_row(db, td_slot)["confirmed_flush_lsn"] == before


def test_advance_to_0_0_exits_2(db: Any, pgpoll: Any, td_slot: str) -> None:
    result = pgpoll("slot", "advance", td_slot, "0/0", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "cannot advance a slot to 0/0" in result.stderr


def test_advance_missing_slot_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "advance", "no_such_slot", "0/1", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'replication slot "no_such_slot" does not exist' in result.stderr


def test_role_without_replication_gets_exit_4_on_every_slot_command(db: Any, pgpoll: Any, td_slot: str, make_role: Any) -> None:
    role = make_role()
    for args in (["create", db.slot_name(), "--plugin", "pgoutput"], ["peek", td_slot], ["advance", td_slot, "FFFFFFFF/0"],
                 ["drop", td_slot]):
        result = pgpoll("slot", *args, "--dsn", role.dsn)
        assert result.exit_code == 4, (args, result.output)
        assert "replication" in result.stderr.splitlines()[0].lower()
        assert "fix: grant the role REPLICATION (ALTER ROLE name REPLICATION)" in result.stderr
    assert slot_exists(db, td_slot)


def test_peek_too_long_publication_name_exits_2(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", db.dsn)
    result = pgpoll("slot", "peek", name, "--publication", "p" * 64, "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "publication name 'pppp" in result.stderr and "is longer than 63 bytes" in result.stderr
