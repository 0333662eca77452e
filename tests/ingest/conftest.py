"""Shared helpers for the ingest tests: run the job in-process or as a real process, read what landed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    """Exit code, the summary JSON line (if any) and stderr of one ingest run."""

    exit_code: int
    summary: dict[str, Any] | None
    stdout: str
    stderr: str


def _summary(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def ingest(dsn: str, *args: str) -> RunResult:
    """``pgpoll ingest ARGS`` in this process (shares the session's SparkSession)."""
    result = CliRunner().invoke(cli, ["ingest", *args], env={"PGPOLL_DSN": dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return RunResult(result.exit_code, _summary(result.stdout), result.stdout, result.stderr)


def ingest_process(dsn: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> RunResult:
    """``python jobs/ingest.py ARGS`` as a separate process (its own Spark), as cron would run it."""
    full_env = dict(os.environ)
    full_env.update({"PGPOLL_DSN": dsn, "PYSPARK_PYTHON": sys.executable})
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "ingest.py"), *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
    return RunResult(proc.returncode, _summary(proc.stdout), proc.stdout, proc.stderr)


def read_output(spark: Any, path: str) -> list[dict[str, Any]]:
    """Every change a plain ``spark.read.parquet(PATH/changes)`` sees, in source order."""
    if not (Path(path) / "changes").exists():
        return []
    frame = spark.read.parquet(str(Path(path) / "changes")).orderBy("commit_lsn", "seq")
    return [row.asDict(recursive=True) for row in frame.collect()]


def confirmed_lsn(db: Any, slot: str) -> str:
    """The slot's confirmed_flush_lsn as text."""
    return db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0]


@dataclass
class Capture:
    """A captured table ``public.items`` with a slot (and a publication for pgoutput)."""

    db: Any
    plugin: str
    slot: str
    output: str

    def args(self, *extra: str) -> list[str]:
        """The ingest arguments for this capture."""
        base = ["--slot", self.slot, "--output", self.output]
        if self.plugin == "pgoutput":
            base += ["--publication", "pub_items"]
        return [*base, *extra]

    def source_rows(self) -> list[tuple[Any, ...]]:
        """What the table holds now."""
        return self.db.execute("SELECT id, v FROM items ORDER BY id")


def make_capture(db: Any, plugin: str, output: Path) -> Capture:
    """Create the table, the slot and (pgoutput) the publication."""
    db.require_plugin(plugin)
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY, v text)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    if plugin == "pgoutput":
        db.execute("CREATE PUBLICATION pub_items FOR TABLE items")
    return Capture(db, plugin, slot, str(output))


def capture_args(db: Any, plugin: str, tables: str) -> list[str]:
    """A slot for ``plugin`` (and, for pgoutput, publication ``p`` of ``tables``); returns ingest's --slot/--publication."""
    db.require_plugin(plugin)
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    if plugin == "pgoutput":
        db.execute(f"CREATE PUBLICATION p FOR TABLE {tables}")
        return ["--slot", slot, "--publication", "p"]
    return ["--slot", slot]


@pytest.fixture(params=["test_decoding", "pgoutput"])
def capture(request: pytest.FixtureRequest, db: Any, tmp_path: Path) -> Capture:
    """A capture for each plugin."""
    return make_capture(db, request.param, tmp_path / "out")
