"""A real PgBouncer in front of a test server, to prove pgpoll works through a connection pooler.

Managed and pooled PostgreSQL is usually reached through PgBouncer, often in
transaction mode, where each transaction may run on a different server
connection and session state (``SET``, advisory locks, libpq ``options``)
does not follow the client. Tests start Debian's ``pgbouncer`` (1.18 on
Debian 12) as configured in the field: ``pool_mode = session`` or
``transaction``, ``auth_type = trust`` on loopback with an ``auth_file``,
and ``ignore_startup_parameters = extra_float_digits,options``.

PgBouncer refuses to run as root: when this process is root it runs as the
``postgres`` OS user, like the test servers (``PGPOLL_TEST_OS_USER``). It
reaches a :class:`~pgpoll.testing.cluster.ThrowawayCluster` through the
cluster's Unix socket (trusted there), and a server given by
``PGPOLL_TEST_DSN`` with that DSN's host, port, user and password. Every
database of the server is served (a ``*`` fallback entry), so a test's fresh
database is reachable at once. The binary is found on ``PATH``, in
``/usr/sbin``, or at ``PGPOLL_TEST_PGBOUNCER``.

>>> bouncer = PgBouncer(cluster, pool_mode="transaction").start()   # doctest: +SKIP
>>> bouncer.dsn("mydb")                                             # doctest: +SKIP
'postgresql://postgres@127.0.0.1:6543/mydb'
>>> bouncer.stop()                                                  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg2.extensions

from pgpoll.testing.cluster import as_server_user, free_port, server_uid_gid

POOL_MODES = ("session", "transaction")


def find_pgbouncer() -> str | None:
    """The pgbouncer binary, or None when it is not installed."""
    env = os.environ.get("PGPOLL_TEST_PGBOUNCER")
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which("pgbouncer")
    if found:
        return found
    for candidate in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _ini_value(value: str) -> str:
    # pgbouncer's connection strings are libpq-like key=value; quote values with spaces or quotes.
    if value and not any(c in value for c in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class PgBouncer:
    """One PgBouncer process in front of ``server`` (a ThrowawayCluster or an ExternalServer)."""

    server: Any
    pool_mode: str = "transaction"
    binary: str | None = None
    port: int = 0
    pool_size: int = 4
    root: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    user: str = field(default="")
    settings: dict[str, str] = field(default_factory=dict)
    """More ``[pgbouncer]`` settings (e.g. ``{"query_wait_timeout": "2"}``), written after the defaults."""

    def start(self) -> PgBouncer:
        """Write the configuration, start PgBouncer and wait until it accepts connections; returns self."""
        if self.pool_mode not in POOL_MODES:
            raise ValueError(f"pool_mode must be one of {POOL_MODES}, not {self.pool_mode!r}")
        binary = self.binary or find_pgbouncer()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        try:
            self._start(binary)
        except BaseException:
            self.stop()
            raise
        return self

    def _backend(self) -> tuple[str, str]:
        """The ``[databases]`` connection string and the user name clients log in as."""
        socket_dir = getattr(self.server, "root", None)
        if socket_dir is not None and hasattr(self.server, "superuser"):
            return f"host={_ini_value(str(socket_dir))} port={self.server.port}", str(self.server.superuser)
        params = psycopg2.extensions.parse_dsn(self.server.dsn("postgres"))
        parts = [f"{key}={_ini_value(str(params[key]))}" for key in ("host", "port", "user", "password") if params.get(key)]
        return " ".join(parts), str(params.get("user") or "postgres")

    def _start(self, binary: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"pgpoll-pgbouncer-{self.pool_mode}-"))
        backend, self.user = self._backend()
        self.port = self.port or free_port()
        (self.root / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = {backend}",
                    "",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.root / 'userlist.txt'}",
                    f"pool_mode = {self.pool_mode}",
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"default_pool_size = {self.pool_size}",
                    # Hand out the pool's server connections in turn (not the most recent first), so a
                    # client's consecutive transactions really do land on different server connections.
                    "server_round_robin = 1",
                    "max_client_conn = 200",
                    f"admin_users = {self.user}",
                    f"logfile = {self.root / 'pgbouncer.log'}",
                    f"pidfile = {self.root / 'pgbouncer.pid'}",
                    *(f"{name} = {value}" for name, value in self.settings.items()),
                    "",
                ]
            )
        )
        ids = server_uid_gid()
        if ids:
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, *ids)
        self.process = subprocess.Popen(
            [*as_server_user(), binary, str(self.root / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}:\n{self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on port {self.port} within 30 s:\n{self.log()[-2000:]}")

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URI for ``dbname`` through PgBouncer (no password: trust on loopback)."""
        return f"postgresql://{quote(self.user, safe='')}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def fill_pool(self, dbname: str, statements: tuple[str, ...] = ()) -> list[int]:
        """Open the pool's every server connection for ``dbname`` and run ``statements`` on each.

        ``pool_size`` clients hold a transaction at the same time, so PgBouncer
        opens that many server connections; each runs ``statements`` (for
        example session-level ``SET``s that, in transaction mode, stay behind
        for whoever lands there next). Returns the server PIDs.
        """
        import psycopg2

        clients = [psycopg2.connect(self.dsn(dbname)) for _ in range(self.pool_size)]
        try:
            pids: list[int] = []
            for conn in clients:  # autocommit off: each holds its server connection until commit
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")
                    row = cur.fetchone()
                    assert row is not None
                    pids.append(int(row[0]))
                    for statement in statements:
                        cur.execute(statement)
            for conn in clients:
                conn.commit()
            return pids
        finally:
            for conn in clients:
                conn.close()

    def log(self) -> str:
        """PgBouncer's log, for diagnosing a failed test."""
        try:
            return (self.root / "pgbouncer.log").read_text(errors="replace") if self.root else ""
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop PgBouncer (its process group: runuser and pgbouncer) and delete its directory."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
