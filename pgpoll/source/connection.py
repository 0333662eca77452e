"""Where to connect and how: DSN resolution, password redaction, pinned session settings.

The connection comes from ``--dsn``, else ``PGPOLL_DSN``, else libpq's own
variables (``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGDATABASE``, ``PGPASSWORD``,
which libpq reads itself when the DSN is empty). A DSN may be a libpq URI
(``postgresql://...``), a key/value string (``host=... dbname=...``) or a
SQLAlchemy URL (``postgresql+psycopg2://...``).

The settings that change how values print are pinned inside every
transaction that reads values (:mod:`pgpoll.source.session`), not here:
nothing rests on session state, so a connection pooler in front of the server
changes nothing. The connection sends only startup parameters a pooler
accepts (``application_name``, ``client_encoding``); the user's own libpq
``options`` (DSN or ``PGOPTIONS``) are passed on untouched.
No password ever reaches a message: use :func:`redact`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions

from pgpoll.errors import ConfigError, ConnectionFailedError, first_line

_KV_PASSWORD = re.compile(r"(?<![?&])(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
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
    """A SQLAlchemy URL (``postgresql+driver://...``) as a libpq connection string.

    Several hosts (failover: ``target_session_attrs=read-write``) come in two
    forms: libpq's own, in the authority (``postgresql+psycopg2://u@a:5432,b:5432/db``),
    which SQLAlchemy cannot parse and libpq can once the ``+driver`` is gone;
    and SQLAlchemy's (its psycopg2 dialect's), repeated ``host`` query
    parameters (``?host=a:5432&host=b:5432``), which a libpq URI would read as
    one host named ``a:5432``: turned into ``host=a,b port=5432,5432``.
    """
    # Imported here: SQLAlchemy costs a tenth of a second, and only these URLs need it.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    scheme, _, rest = url_text.partition("://")
    if scheme.lower().split("+")[0] in ("postgresql", "postgres") and "," in rest.split("/", 1)[0]:
        return "postgresql://" + rest
    try:
        url = make_url(url_text)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"cannot parse connection URL {redact(url_text)!r}",
            "use postgresql://user@host:port/dbname or host=... dbname=...",
        ) from exc
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigError(
            f"connection URL is for {url.get_backend_name()!r}, not PostgreSQL",
            "use a postgresql:// URL",
        )
    hosts = url.query.get("host")
    if hosts is not None and not url.host and (isinstance(hosts, tuple) or ":" in hosts):
        pairs = [h.rsplit(":", 1) if ":" in h else [h, ""] for h in ((hosts,) if isinstance(hosts, str) else hosts)]
        params: dict[str, str] = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items() if k != "host"}
        params.update(host=",".join(h for h, _ in pairs), port=",".join(p for _, p in pairs),
                      user=url.username or "", password=url.password or "", dbname=url.database or "")
        return psycopg2.extensions.make_dsn(**{k: v for k, v in params.items() if v.strip(",")})
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def resolve_dsn(dsn: str | None = None) -> ConnectionTarget:
    """Resolve the connection: ``dsn`` argument, ``PGPOLL_DSN``, then libpq variables."""
    source = "--dsn"
    if not dsn:
        dsn = os.environ.get("PGPOLL_DSN") or ""
        source = "PGPOLL_DSN" if dsn else "libpq environment"
    dsn = dsn.strip()
    scheme = re.match(r"^([a-z][a-z0-9+.\-]*)://", dsn, re.IGNORECASE)
    if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
        dsn = _from_sqlalchemy(dsn)  # postgresql+driver://..., or a clear error for mysql:// etc.
    if dsn:
        try:
            psycopg2.extensions.parse_dsn(dsn)
        except psycopg2.ProgrammingError as exc:
            raise ConfigError(
                f"cannot parse connection string {redact(dsn)!r} ({source})",
                "use postgresql://user@host:port/dbname or host=... dbname=...",
            ) from exc
    return ConnectionTarget(dsn=dsn, source=source)


# libpq reports connection failures without a SQLSTATE; recognise them by their
# (untranslated, lc_messages C) text. The SQLSTATE decides retries: the ingest
# control connection retries a failure at start only for 57P03 and 53300.
_CONNECT_FAILURES = (
    ("password authentication failed", "28P01", "check the password (in the DSN, PGPASSWORD or ~/.pgpass)"),
    ("no password supplied", "28P01", "give a password in the DSN, PGPASSWORD or ~/.pgpass"),
    ("permission denied for database", "42501", "grant the role CONNECT on the database (see sql/least_privilege.sql)"),
    ("no pg_hba.conf entry", "28000", "allow this host and role in the server's pg_hba.conf"),
    ("role \"", "28000", "check the user name (or create the role: see sql/least_privilege.sql)"),
    ("database \"", "3D000", "check the database name in the DSN (or PGDATABASE)"),
    ("connection refused", "08001", "check the host and port, and that the server is up and listening on them"),
    ("authentication failed", "28000", "check the user name and password (a pooler's auth_file lists its users)"),
    ("timeout expired", "08001", "the server (or a pooler in front of it) did not answer in time: check host, port and server"),
    ("could not translate host name", "08001", "check the host name in the DSN (or PGHOST): it does not resolve"),
    ("the database system is", "57P03", "the server is starting up, shutting down or in recovery: try again shortly"),
    ("too many clients", "53300", "the server has no free connection slot: try again, or raise max_connections"),
    ("unsupported startup parameter", "08P01",
     "a connection pooler (PgBouncer) refused a libpq startup parameter: remove `options` from the DSN and PGOPTIONS "
     "(pgpoll needs none), or add it to the pooler's ignore_startup_parameters"),
    ("remaining connection slots are reserved", "53300", "the server has no free connection slot: try again"),
)


def _classify(detail: str) -> tuple[str | None, str]:
    low = detail.lower()
    for marker, sqlstate, hint in _CONNECT_FAILURES:
        if marker in low:
            return sqlstate, hint
    return None, "check --dsn / PGPOLL_DSN (or PGHOST, PGPORT, PGUSER, PGDATABASE) and that the server is up"


def connect_kwargs(target: ConnectionTarget, application_name: str = "pgpoll", connect_timeout: int = 10) -> dict[str, Any]:
    """The libpq keywords pgpoll adds to every connection string (psycopg2 and ADBC alike)."""
    params = psycopg2.extensions.parse_dsn(target.dsn) if target.dsn else {}
    return {
        # An explicit keyword overrides libpq's own fallbacks, so carry them over.
        "application_name": params.get("application_name") or os.environ.get("PGAPPNAME") or application_name,
        "connect_timeout": params.get("connect_timeout") or connect_timeout,
        # A startup parameter PgBouncer accepts; every transaction that reads values pins it again.
        "client_encoding": "UTF8",
    }


def connect(
    target: ConnectionTarget,
    *,
    application_name: str = "pgpoll",
    autocommit: bool = True,
    connect_timeout: int = 10,
) -> Any:
    """Open a psycopg2 connection (settings are pinned per transaction: :mod:`pgpoll.source.session`).

    Raises :class:`ConnectionFailedError` (password redacted) when the server
    cannot be reached or refuses the login; its ``sqlstate`` tells a bad
    password (``28P01``), an unknown role or refused host (``28000``) or
    database (``3D000``) from a server that is down (``08001``).
    """
    kwargs = connect_kwargs(target, application_name, connect_timeout)
    try:
        conn = psycopg2.connect(target.dsn, **kwargs)
    except psycopg2.OperationalError as exc:
        detail = redact(first_line(exc) if str(exc).strip() else "connection failed", tuple(p for p in [target.password()] if p))
        sqlstate, hint = _classify(detail)
        raise ConnectionFailedError(
            f"cannot connect to {target.redacted()}: {detail}", hint, sqlstate=getattr(exc, "pgcode", None) or sqlstate
        ) from None
    conn.autocommit = autocommit
    return conn
