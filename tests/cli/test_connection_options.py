"""Where the CLI connects (--dsn, PGPOLL_DSN, libpq PG* variables, SQLAlchemy URLs) and that no password is ever printed."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg2.extensions
import pytest


def libpq_env(db: Any, password: str | None = None) -> dict[str, str | None]:
    params = psycopg2.extensions.parse_dsn(db.dsn)
    return {
        "PGHOST": params["host"],
        "PGPORT": params["port"],
        "PGUSER": params["user"],
        "PGPASSWORD": password if password is not None else params["password"],
        "PGDATABASE": db.name,
    }


def wrong_password_dsn(db: Any, password: str) -> str:
    params = psycopg2.extensions.parse_dsn(db.dsn)
    return f"postgresql://{params['user']}:{quote(password, safe='')}@{params['host']}:{params['port']}/{db.name}"


def test_wrong_password_exits_4_without_printing_it(db: Any, pgpoll: Any) -> None:
    secret = "Wr0ng-S3cret!pw"
    for debug in ("0", "1"):
        result = pgpoll("slot", "list", "--dsn", wrong_password_dsn(db, secret), env={"PGPOLL_DEBUG": debug})
        assert result.exit_code == 4
        assert "password authentication failed for user" in result.stderr
        assert "fix: check the password" in result.stderr
        assert "postgres:***@127.0.0.1" in result.stderr
        assert secret not in result.output and quote(secret, safe="") not in result.output


def test_wrong_password_in_key_value_dsn_and_pgpassword_is_never_printed(db: Any, pgpoll: Any) -> None:
    params = psycopg2.extensions.parse_dsn(db.dsn)
    secret = "kv secret pw"
    kv = f"host={params['host']} port={params['port']} dbname={db.name} user={params['user']} password='{secret}'"
    result = pgpoll("check", "--dsn", kv)
    assert result.exit_code == 4
    assert "password='***'" in result.stderr or "password=***" in result.stderr
    assert secret not in result.output
    env_result = pgpoll("check", env=libpq_env(db, password="env-secret-pw"))
    assert env_result.exit_code == 4
    assert "env-secret-pw" not in env_result.output
    assert "(libpq environment variables)" in env_result.stderr


def test_connection_refused_exits_4(pgpoll: Any) -> None:
    result = pgpoll("slot", "list", "--dsn", "postgresql://someone:pw-refused@127.0.0.1:1/db")
    assert result.exit_code == 4
    assert "error: cannot connect to postgresql://someone:***@127.0.0.1:1/db" in result.stderr
    assert "Connection refused" in result.stderr
    assert "fix: check the host and port" in result.stderr
    assert "pw-refused" not in result.output


def test_unknown_database_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "list", "--dsn", db.server.dsn("no_such_db"))
    assert result.exit_code == 4
    assert 'database "no_such_db" does not exist' in result.stderr
    assert "fix: check the database name" in result.stderr
    assert db.server.password not in result.output


def test_unparseable_dsn_exits_2(pgpoll: Any) -> None:
    result = pgpoll("slot", "list", "--dsn", "host=127.0.0.1 password=oops-secret nonsense")
    assert result.exit_code == 2
    assert "cannot parse connection string" in result.stderr
    assert "oops-secret" not in result.output


def test_non_postgresql_sqlalchemy_url_exits_2(pgpoll: Any) -> None:
    result = pgpoll("slot", "list", "--dsn", "mysql+pymysql://u:my-secret@127.0.0.1/db")
    assert result.exit_code == 2
    assert "connection URL is for 'mysql', not PostgreSQL" in result.stderr
    assert "my-secret" not in result.output


@pytest.mark.parametrize("driver", ["postgresql+psycopg2", "postgresql+psycopg", "postgres+psycopg2"])
def test_sqlalchemy_url_is_accepted(db: Any, pgpoll: Any, driver: str) -> None:
    url = db.dsn.replace("postgresql://", f"{driver}://", 1)
    name = db.slot_name()
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", "--dsn", url)
    assert result.exit_code == 0, result.output
    assert db.execute("SELECT database FROM pg_replication_slots WHERE slot_name = %s", (name,)) == [(db.name,)]


def test_pgpoll_dsn_env_is_used_without_dsn_option(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0, result.output
    assert db.execute("SELECT database FROM pg_replication_slots WHERE slot_name = %s", (name,)) == [(db.name,)]


def test_dsn_option_wins_over_pgpoll_dsn(db: Any, pgpoll: Any) -> None:
    result = pgpoll("slot", "list", "--dsn", db.dsn, env={"PGPOLL_DSN": "postgresql://x:y@127.0.0.1:1/z"})
    assert result.exit_code == 0, result.output


def test_libpq_variables_are_used_without_dsn_or_pgpoll_dsn(db: Any, pgpoll: Any) -> None:
    name = db.slot_name()
    result = pgpoll("slot", "create", name, "--plugin", "pgoutput", env=libpq_env(db))
    assert result.exit_code == 0, result.output
    # PGDATABASE chose the database the slot belongs to.
    assert db.execute("SELECT database FROM pg_replication_slots WHERE slot_name = %s", (name,)) == [(db.name,)]
    check = pgpoll("check", env=libpq_env(db))
    assert check.exit_code == 0
    assert check.stdout.splitlines()[0] == "server: (libpq environment variables)"


def test_no_command_ever_prints_the_password(db: Any, pgpoll: Any) -> None:
    db.require_plugin("test_decoding")
    secret = db.server.password
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = db.slot_name()
    commands = [
        ["check", "--plugin", "test_decoding"],
        ["check", "--json", "--publication", "missing_pub"],
        ["publication", "create", "p", "--table", "t"],
        ["publication", "create", "p", "--table", "t"],
        ["publication", "show", "p"],
        ["publication", "show", "p", "--json"],
        ["slot", "create", slot, "--plugin", "test_decoding"],
        ["slot", "create", slot, "--plugin", "test_decoding"],
        ["slot", "list"],
        ["slot", "list", "--json"],
        ["slot", "peek", slot, "--json"],
        ["slot", "advance", slot, "FFFFFFFF/0"],
        ["slot", "advance", slot, "nonsense"],
        ["slot", "peek", "missing_slot"],
        ["slot", "drop", slot],
        ["slot", "drop", slot],
        ["publication", "drop", "p"],
        ["publication", "drop", "p"],
    ]
    codes = []
    for args in commands:
        for how in ("option", "env", "sqlalchemy"):
            if how == "option":
                result = pgpoll(*args, "--dsn", db.dsn)
            elif how == "env":
                result = pgpoll(*args, env={"PGPOLL_DSN": db.dsn, "PGPOLL_DEBUG": "1"})
            else:
                result = pgpoll(*args, "--dsn", db.dsn.replace("postgresql://", "postgresql+psycopg2://"))
            assert secret not in result.output, (args, how)
            codes.append(result.exit_code)
    assert set(codes) == {0, 2, 4}  # success and error paths were both exercised
