"""Fixtures for the CLI tests: run ``pgpoll`` in-process, make login roles, hold a slot busy.

Everything runs against the real throwaway server of the ``db`` fixture. Each
``pgpoll(...)`` call gets an environment without ``PGPOLL_DSN`` and the libpq
``PG*`` variables unless the test passes them, so a developer's own settings
never leak into a test.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from psycopg2 import sql

from pgpoll.cli.main import cli
from pgpoll.testing.cluster import find_bindirs, wait_until

CLEAN_ENV: dict[str, str | None] = {
    name: None
    for name in ("PGPOLL_DSN", "PGPOLL_DEBUG", "PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE",
                 "PGSERVICE", "PGPASSFILE", "PGOPTIONS")
}

Pgpoll = Callable[..., Result]


@pytest.fixture
def pgpoll() -> Pgpoll:
    """``pgpoll(*args, env=None)``: invoke the CLI in-process; returns click's ``Result``."""
    runner = CliRunner()

    def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
        return runner.invoke(cli, list(args), env={**CLEAN_ENV, **(env or {})}, catch_exceptions=False)

    return run


@dataclass(frozen=True)
class Role:
    """A login role made for one test."""

    name: str
    password: str
    dsn: str


@pytest.fixture
def make_role(db: Any) -> Iterator[Callable[..., Role]]:
    """``make_role("REPLICATION")``: a LOGIN role with a password; dropped after the test."""
    made: list[str] = []

    def make(*attributes: str) -> Role:
        name = "r_" + uuid.uuid4().hex[:10]
        password = "rpw-" + secrets.token_hex(8)
        attrs = " ".join(a for a in attributes if a.replace("_", "").isalpha())
        db.execute(sql.SQL("CREATE ROLE {} LOGIN " + attrs + " PASSWORD %s").format(sql.Identifier(name)), (password,))
        made.append(name)
        return Role(name, password, db.server.dsn(db.name, user=name, password=password))

    yield make
    for name in made:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def pg_recvlogical() -> Path:
    """A ``pg_recvlogical`` binary (any installed version streams from 15 to 18)."""
    for inst in find_bindirs().values():
        if (inst.bindir / "pg_recvlogical").exists():
            return inst.bindir / "pg_recvlogical"
    found = shutil.which("pg_recvlogical")
    if not found:
        pytest.skip("no pg_recvlogical binary to hold a slot with")
    return Path(found)


@pytest.fixture
def hold_slot(db: Any) -> Iterator[Callable[[str], int]]:
    """``hold_slot(name)``: another consumer (pg_recvlogical) streams from the slot; returns its backend PID."""
    procs: list[subprocess.Popen[bytes]] = []

    def hold(slot: str) -> int:
        proc = subprocess.Popen(
            [str(pg_recvlogical()), "-d", db.dsn, "--slot", slot, "--start", "--no-loop", "-f", "/dev/null"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        procs.append(proc)
        query = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active"
        if not wait_until(lambda: proc.poll() is not None or bool(db.execute(query, (slot,))), timeout=20):
            raise AssertionError(f"pg_recvlogical did not take slot {slot}")
        if proc.poll() is not None:
            raise AssertionError(f"pg_recvlogical exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        return int(db.execute(query, (slot,))[0][0])

    yield hold
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
