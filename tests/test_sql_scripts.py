"""``sql/least_privilege.sql`` and ``sql/monitoring.sql`` run through psql against the real server.

The capture role made by the set-up script then creates, peeks, advances and
drops slots through the pgpoll CLI without being a superuser.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg2 import sql

from pgpoll.cli.main import cli
from pgpoll.testing.cluster import find_bindirs

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
ROLE = 'Capture "Role" x'  # a hostile name: the script must quote it
PASSWORD = "pw with 'quote' and space"
SCHEMA = "App Data"


def psql_binary(server: Any) -> Path:
    inst = getattr(server, "installation", None)
    candidates: list[Path] = [inst.bindir / "psql"] if inst else []
    candidates += [i.bindir / "psql" for i in find_bindirs().values()]
    for path in candidates:
        if path.exists():
            return path
    found = shutil.which("psql")
    if not found:
        pytest.skip("no psql binary to run the sql/ scripts with")
    return Path(found)


def run_psql(server: Any, dsn: str, script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    args = [str(psql_binary(server)), "-X", "-q", "--csv", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(SQL_DIR / script)]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)


def sections(output: str) -> dict[str, list[dict[str, str]]]:
    """Split monitoring.sql's CSV output at its ``== title`` lines."""
    found: dict[str, list[dict[str, str]]] = {}
    title, lines = "", []  # type: ignore[var-annotated]
    for line in [*output.splitlines(), "== end"]:
        if line.startswith("== "):
            if title:
                found[title] = list(csv.DictReader(io.StringIO("\n".join(lines))))
            title, lines = line[3:].split(":")[0], []
        else:
            lines.append(line)
    return found


@pytest.fixture
def capture_role(db: Any) -> Iterator[str]:
    """Run least_privilege.sql for schema "App Data"; yield the capture role's DSN; drop the role after."""
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    db.execute(sql.SQL("CREATE TABLE {}.orders (id int PRIMARY KEY, total numeric)").format(sql.Identifier(SCHEMA)))
    done = run_psql(db.server, db.dsn, "least_privilege.sql", role=ROLE, password=PASSWORD, schema=SCHEMA)
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"capture role {ROLE}: LOGIN REPLICATION, SELECT on {SCHEMA}, publication pgpoll_{SCHEMA}"
        yield db.server.dsn(db.name, user=ROLE, password=PASSWORD)
    finally:
        db.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(f"pgpoll_{SCHEMA}")))
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(ROLE)))
        db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))


def test_least_privilege_script_makes_a_replication_role_that_is_not_superuser(
    db: Any, capture_role: str
) -> None:
    row = db.execute(
        "SELECT rolcanlogin, rolreplication, rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = %s", (ROLE,)
    )
    assert row == [(True, True, False, False, False)]
    assert db.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (ROLE, f'"{SCHEMA}".orders')) == [(True,)]
    assert db.execute("SELECT pubname FROM pg_publication") == [(f"pgpoll_{SCHEMA}",)]
    # Default privileges: a table the schema owner creates later is readable too.
    db.execute(sql.SQL("CREATE TABLE {}.later (id int PRIMARY KEY)").format(sql.Identifier(SCHEMA)))
    assert db.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (ROLE, f'"{SCHEMA}".later')) == [(True,)]


def test_least_privilege_script_can_run_again(db: Any, capture_role: str) -> None:
    again = run_psql(db.server, db.dsn, "least_privilege.sql", role=ROLE, password=PASSWORD, schema=SCHEMA)
    assert again.returncode == 0, again.stderr


def test_least_privilege_script_refuses_missing_variables(db: Any) -> None:
    done = run_psql(db.server, db.dsn, "least_privilege.sql", role="r_missing_pw")
    assert done.returncode == 3
    assert "set its password: psql -v password=SECRET" in done.stderr
    assert db.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'r_missing_pw'") == [(0,)]


def test_capture_role_creates_peeks_advances_and_drops_slots_through_the_cli(db: Any, capture_role: str) -> None:
    db.require_plugin("test_decoding")
    runner = CliRunner()

    def pgpoll(*args: str) -> Any:
        return runner.invoke(cli, [*args, "--dsn", capture_role], env={"PGPOLL_DSN": None, "PGPASSWORD": None})

    check = pgpoll("check", "--plugin", "test_decoding", "--publication", f"pgpoll_{SCHEMA}")
    assert check.exit_code == 0, check.output
    assert "(replication)" in check.stdout
    orders = sql.SQL("{}.orders").format(sql.Identifier(SCHEMA))
    for plugin, extra in (("test_decoding", []), ("pgoutput", ["--publication", f"pgpoll_{SCHEMA}"])):
        slot = db.slot_name("capture")
        assert pgpoll("slot", "create", slot, "--plugin", plugin).exit_code == 0
        db.execute(sql.SQL("INSERT INTO {} VALUES (1, 9.5), (2, 3)").format(orders))
        db.execute(sql.SQL("DELETE FROM {}").format(orders))
        peek = pgpoll("slot", "peek", slot, "--json", *extra)
        assert peek.exit_code == 0, peek.output
        rows = [json.loads(line) for line in peek.stdout.splitlines()]
        assert len(rows) >= 6
        commit = rows[-1]["lsn"]
        advanced = pgpoll("slot", "advance", slot, commit)
        assert advanced.exit_code == 0 and advanced.stdout.strip().endswith(f"to {commit}")
        assert pgpoll("slot", "peek", slot, *extra).stdout == ""
        assert pgpoll("slot", "drop", slot).exit_code == 0
    assert db.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'capture%%'") == [(0,)]


def test_capture_role_cannot_create_publications(db: Any, capture_role: str) -> None:
    result = CliRunner().invoke(cli, ["publication", "create", "mine", "--table", f'"{SCHEMA}".orders', "--dsn", capture_role])
    assert result.exit_code == 4
    assert "publications are created by the tables' owner" in result.stderr


def test_monitoring_script_reports_lag_inactive_slots_and_settings(db: Any) -> None:
    slot = db.slot_name()
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
    done = run_psql(db.server, db.dsn, "monitoring.sql")
    assert done.returncode == 0, done.stderr
    found = sections(done.stdout)
    assert set(found) == {"slot lag", "inactive slots", "slots at risk", "settings"}
    (lag,) = [r for r in found["slot lag"] if r["slot_name"] == slot]
    expected = db.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, confirmed_flush_lsn)::bigint FROM pg_replication_slots "
                          "WHERE slot_name = %s", (lag["current_lsn"], slot))[0][0]
    assert int(lag["lag_bytes"]) == expected > 0
    assert lag["wal_status"] == "reserved" and lag["safe_wal_size"] == "" and lag["active"] == "f"
    assert slot in [r["slot_name"] for r in found["inactive slots"]]
    assert slot not in [r["slot_name"] for r in found["slots at risk"]]
    settings = {r["name"]: r["setting"] for r in found["settings"]}
    assert settings["wal_level"] == "logical" and settings["max_slot_wal_keep_size"] == "-1"
    assert int(settings["slots in use"]) >= 1


def test_monitoring_script_runs_as_the_capture_role(db: Any, capture_role: str) -> None:
    done = run_psql(db.server, capture_role, "monitoring.sql", risk_bytes="1")
    assert done.returncode == 0, done.stderr
    assert set(sections(done.stdout)) == {"slot lag", "inactive slots", "slots at risk", "settings"}
