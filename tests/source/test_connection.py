"""DSN resolution, password redaction, what a connection sends at start-up, and connection failures."""

from __future__ import annotations

import pickle
from typing import Any

import psycopg2.extensions
import pytest

from pgpoll.errors import ConfigError, ConnectionFailedError
from pgpoll.source.connection import ConnectionTarget, connect, redact, resolve_dsn
from pgpoll.source.server_errors import is_transient
from pgpoll.source.session import SESSION_SETTINGS, pinned_transaction


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGPOLL_DSN", "PGPASSWORD", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:s3cret@h:5/db", "postgresql://u:***@h:5/db"),
        ("postgresql+psycopg2://u:s3cret@h/db", "postgresql+psycopg2://u:***@h/db"),
        ("postgresql://u@h:5432/db", "postgresql://u@h:5432/db"),
        ("host=h password=s3cret user=u", "host=h password=*** user=u"),
        ("host=h password = 's3 cr\\'et' user=u", "host=h password = *** user=u"),
        ("postgresql://h/db?user=u&password=s3cret&sslmode=require", "postgresql://h/db?user=u&password=***&sslmode=require"),
        ("failed: PASSWORD=s3cret", "failed: PASSWORD=***"),
    ],
)
def test_redact_hides_every_password_form(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redact_hides_given_secrets_and_pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "from-env-pw")
    assert redact("a from-env-pw b other-pw", ("other-pw",)) == "a *** b ***"
    assert redact("ab", ("a",)) == "ab"  # too short to replace safely


def test_resolve_dsn_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dsn("host=a") == ConnectionTarget("host=a", "--dsn")
    monkeypatch.setenv("PGPOLL_DSN", "host=b")
    assert resolve_dsn(None) == ConnectionTarget("host=b", "PGPOLL_DSN")
    assert resolve_dsn("host=a").source == "--dsn"
    monkeypatch.delenv("PGPOLL_DSN")
    assert resolve_dsn(None) == ConnectionTarget("", "libpq environment")
    assert resolve_dsn(None).redacted() == "(libpq environment variables)"


def test_resolve_dsn_converts_sqlalchemy_urls() -> None:
    target = resolve_dsn("postgresql+psycopg2://u:p%40ss@h:5433/db?sslmode=disable")
    params = psycopg2.extensions.parse_dsn(target.dsn)
    assert params == {"user": "u", "password": "p@ss", "host": "h", "port": "5433", "dbname": "db", "sslmode": "disable"}
    assert target.password() == "p@ss"


@pytest.mark.parametrize(("dsn", "message"), [("mysql://u:p@h/db", "is for 'mysql', not PostgreSQL"),
                                              ("host=h oops", "cannot parse connection string")])
def test_resolve_dsn_refuses_bad_input(dsn: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_dsn(dsn)
    assert message in caught.value.message


def test_target_repr_is_redacted() -> None:
    target = resolve_dsn("postgresql://u:topsecret@h/db")
    assert "topsecret" not in repr(target)
    assert target.password() == "topsecret"


def test_connect_sends_no_settings_and_transactions_pin_them(db: Any) -> None:
    # Nothing through libpq's options (a pooler drops it): the session keeps the database's own
    # settings, and only a pinned transaction sees pgpoll's; they end with it.
    db.execute(f"ALTER DATABASE \"{db.name}\" SET TimeZone = 'America/New_York'")
    db.execute(f"ALTER DATABASE \"{db.name}\" SET extra_float_digits = 3")
    conn = connect(resolve_dsn(db.dsn))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('TimeZone'), current_setting('extra_float_digits'), "
                        "current_setting('application_name'), current_setting('client_encoding')")
            assert cur.fetchone() == ("America/New_York", "3", "pgpoll", "UTF8")
        with pinned_transaction(conn) as cur:
            for name, value in SESSION_SETTINGS.items():
                cur.execute("SELECT current_setting(%s)", (name,))
                assert cur.fetchone()[0] == value, name
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('TimeZone'), current_setting('extra_float_digits')")
            assert cur.fetchone() == ("America/New_York", "3")
        assert conn.autocommit is True
    finally:
        conn.close()


def test_connect_keeps_the_users_own_options_and_application_name(db: Any) -> None:
    db.execute("CREATE SCHEMA app")
    dsn = db.dsn + "?application_name=etl&options=-csearch_path%3Dapp"
    conn = connect(resolve_dsn(dsn))
    try:
        with pinned_transaction(conn) as cur:
            cur.execute("SELECT current_setting('search_path'), current_setting('application_name'), current_setting('TimeZone')")
            assert cur.fetchone() == ("app", "etl", "UTC")
    finally:
        conn.close()


def test_connect_keeps_pgoptions_and_pgappname(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=7MB")
    monkeypatch.setenv("PGAPPNAME", "from-env")
    conn = connect(resolve_dsn(db.dsn))
    try:
        with pinned_transaction(conn) as cur:
            cur.execute("SELECT current_setting('work_mem'), current_setting('application_name'), current_setting('DateStyle')")
            assert cur.fetchone() == ("7MB", "from-env", "ISO, MDY")
    finally:
        conn.close()


def test_connect_failures_carry_sqlstate_and_transience(db: Any) -> None:
    cases = [
        (db.dsn.replace(db.server.password, "wrong-pw-xyz"), "28P01", False),
        (db.server.dsn("no_such_database"), "3D000", False),
        ("postgresql://u:p@127.0.0.1:1/db", "08001", True),
    ]
    for dsn, sqlstate, transient in cases:
        with pytest.raises(ConnectionFailedError) as caught:
            connect(resolve_dsn(dsn), connect_timeout=5)
        error = caught.value
        assert error.sqlstate == sqlstate, error.message
        assert is_transient(error) is transient
        assert "wrong-pw-xyz" not in str(error) and db.server.password not in str(error)
        assert pickle.loads(pickle.dumps(error)).sqlstate == sqlstate
