"""Multi-host DSNs (``host=a,b target_session_attrs=read-write``): every command that connects goes through libpq's
host list, in the key=value form and in both SQLAlchemy URL forms.

The first host of each list is a port where nothing listens (a stopped old
primary); libpq moves on to the next, the live server. Commands run
in-process (``CliRunner``); ``ingest`` peeks through ADBC (pgoutput), which gets
the same connection string.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from pgpoll.testing.cluster import free_port
from tests.cli.conftest import Pgpoll


def _forms(db: Any) -> dict[str, str]:
    port, dead, password = db.server.port, free_port(), db.server.password
    return {
        "key=value": (f"host=127.0.0.1,127.0.0.1 port={dead},{port} dbname={db.name} user=postgres "
                      f"password={password} target_session_attrs=read-write"),
        "sqlalchemy query hosts": (f"postgresql+psycopg2://postgres:{quote(password, safe='')}@/{db.name}"
                                   f"?host=127.0.0.1:{dead}&host=127.0.0.1:{port}&target_session_attrs=read-write"),
        "sqlalchemy authority hosts": (f"postgresql+psycopg2://postgres:{quote(password, safe='')}@127.0.0.1:{dead},"
                                       f"127.0.0.1:{port}/{db.name}?target_session_attrs=read-write"),
    }


@pytest.mark.parametrize("form", ["key=value", "sqlalchemy query hosts", "sqlalchemy authority hosts"])
def test_every_command_connects_through_a_host_list_with_a_dead_first_host(
    db: Any, pgpoll: Pgpoll, form: str, tmp_path: Any,
) -> None:
    dsn = _forms(db)[form]
    env = {"PGPOLL_DSN": dsn}
    slot = db.slot_name("multi")
    db.execute("CREATE TABLE multi_t (id int PRIMARY KEY, v text)")
    outputs: list[str] = []

    def ok(*args: str) -> Any:
        result = pgpoll(*args, env=env)
        assert result.exit_code == 0, (args, result.output)
        outputs.append(result.output)
        return result

    ok("check", "--plugin", "pgoutput")
    ok("publication", "create", "multi_pub", "--table", "public.multi_t")
    ok("slot", "create", slot, "--plugin", "pgoutput")
    db.execute("INSERT INTO multi_t SELECT g, 'v' || g FROM generate_series(1, 5) g")
    peeked = ok("slot", "peek", slot, "--publication", "multi_pub", "--json")
    assert len(peeked.stdout.splitlines()) >= 7  # B, R, 5 I, C
    out = str(tmp_path / "out")
    ran = ok("ingest", "--slot", slot, "--output", out, "--publication", "multi_pub")
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["changes"] == 5 and summary["fetch"] == "adbc"
    status = json.loads(ok("status", "--output", out, "--json").stdout.strip().splitlines()[-1])
    assert status["slot"] == slot and status["position"] == "in_sync"
    ok("slot", "list")
    end = db.execute("SELECT pg_current_wal_lsn()::text")[0][0]
    ok("slot", "advance", slot, end)
    ok("slot", "drop", slot)
    ok("publication", "drop", "multi_pub")
    assert not any(db.server.password in text for text in outputs)
