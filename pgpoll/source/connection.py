"""Where to connect and how: DSN resolution, password redaction, pinned session settings.

The connection comes from ``--dsn``, else ``PGPOLL_DSN``, else libpq's own
variables (``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGDATABASE``, ``PGPASSWORD``,
which libpq reads itself when the DSN is empty). A DSN may be a libpq URI
(``postgresql://...``), a key/value string (``host=... dbname=...``) or a
SQLAlchemy URL (``postgresql+psycopg2://...``).

Every session pgpoll opens pins the settings that change how values print
(``TimeZone``, ``DateStyle``, ``IntervalStyle``, ``extra_float_digits``,
``bytea_output``), so both plugins and every run print values identically.
No password ever reaches a message: use :func:`redact`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from pgpoll.errors import ConfigError, ConnectionFailedError

SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}

_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"([a-z][a-z0-9+.\-]*://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&\s]*)", re.IGNORECASE)


def redact(text: str, secrets_: tuple[str, ...] = ()) -> str:
    """Replace every password in ``text`` (DSNs, URIs, key=value) with ``***``."""
    out = _URI_PASSWORD.sub(r"\1***\3", text)
    out = _KV_PASSWORD.sub(r"\1***", out)
    out = _QUERY_PASSWORD.sub(r"\1***", out)
    env_pw = os.environ.get("PGPASSWORD")
    for secret in (*secrets_, env_pw or ""):
        if secret and len(secret) >= 3:
            out = out.replace(secret, "***")
    return out


@dataclass(frozen=True)
class ConnectionTarget:
    """A resolved libpq connection string and where it came from."""

    dsn: str
    source: str

    def redacted(self) -> str:
        """The DSN with any password replaced by ``***``."""
        return redact(self.dsn) if self.dsn else "(libpq environment variables)"

    def password(self) -> str | None:
        """The password the DSN carries, if any (only to redact it elsewhere)."""
        try:
            params = psycopg2.extensions.parse_dsn(self.dsn) if self.dsn else {}
        except psycopg2.ProgrammingError:
            return None
        return params.get("password") or os.environ.get("PGPASSWORD")

    def __repr__(self) -> str:
        return f"ConnectionTarget(dsn={self.redacted()!r}, source={self.source!r})"


def _from_sqlalchemy(url_text: str) -> str:
    try:
        url = make_url(url_text)
    except ArgumentError as exc:
        raise ConfigError(
            f"cannot parse connection URL {redact(url_text)!r}",
            "use postgresql://user@host:port/dbname or host=... dbname=...",
        ) from exc
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigError(
            f"connection URL is for {url.get_backend_name()!r}, not PostgreSQL",
            "use a postgresql:// URL",
        )
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def resolve_dsn(dsn: str | None = None) -> ConnectionTarget:
    """Resolve the connection: ``dsn`` argument, ``PGPOLL_DSN``, then libpq variables."""
    source = "--dsn"
    if not dsn:
        dsn = os.environ.get("PGPOLL_DSN") or ""
        source = "PGPOLL_DSN" if dsn else "libpq environment"
    dsn = dsn.strip()
    if re.match(r"^postgres(ql)?\+", dsn, re.IGNORECASE):
        dsn = _from_sqlalchemy(dsn)
    if dsn:
        try:
            psycopg2.extensions.parse_dsn(dsn)
        except psycopg2.ProgrammingError as exc:
            raise ConfigError(
                f"cannot parse connection string {redact(dsn)!r} ({source})",
                "use postgresql://user@host:port/dbname or host=... dbname=...",
            ) from exc
    return ConnectionTarget(dsn=dsn, source=source)


def _options_value() -> str:
    return " ".join(f"-c {k}={v.replace(' ', chr(92) + ' ')}" for k, v in SESSION_SETTINGS.items())


def connect(
    target: ConnectionTarget,
    *,
    application_name: str = "pgpoll",
    autocommit: bool = True,
    connect_timeout: int = 10,
) -> Any:
    """Open a psycopg2 connection with pgpoll's pinned session settings.

    Raises :class:`ConnectionFailedError` (password redacted) when the server
    cannot be reached or refuses the login.
    """
    kwargs: dict[str, Any] = {
        "application_name": application_name,
        "connect_timeout": connect_timeout,
        "options": _options_value(),
    }
    try:
        conn = psycopg2.connect(target.dsn, **kwargs)
    except psycopg2.OperationalError as exc:
        detail = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else "connection failed",
                        tuple(p for p in [target.password()] if p))
        raise ConnectionFailedError(
            f"cannot connect to {target.redacted()}: {detail}",
            "check --dsn / PGPOLL_DSN (or PGHOST, PGPORT, PGUSER, PGDATABASE) and that the server is up",
            sqlstate=getattr(exc, "pgcode", None),
        ) from None
    conn.autocommit = autocommit
    return conn
