"""The error boundary of ``pgpoll`` (messages, exit codes, redaction) and the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pgpoll import errors
from pgpoll.cli import exitcodes
from pgpoll.cli.main import PgpollGroup, cli, report_error

CONSOLE_SCRIPT = Path(sys.executable).parent / "pgpoll"


def boundary(error: BaseException) -> Any:
    """Run a throwaway command under PgpollGroup that raises ``error``."""

    @click.group(cls=PgpollGroup)
    def group() -> None:
        pass

    @group.command()
    def boom() -> None:
        raise error

    return CliRunner().invoke(group, ["boom"], env={"PGPOLL_DEBUG": None}, catch_exceptions=False)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.ConfigError("bad option", "use another"), 2),
        (errors.SlotBusyError("busy", "wait"), 3),
        (errors.SlotNotFoundError("gone", "create it"), 4),
        (errors.ConnectionFailedError("refused", "start it"), 4),
        (errors.SinkError("cannot write", "check the path"), 5),
        (errors.DecodeError("bad byte", "report it", offset=3), 6),
        (errors.PgpollError("plain", "hint"), 1),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_boundary_prints_message_and_fix_and_exits_with_the_documented_code(error: errors.PgpollError, code: int) -> None:
    result = boundary(error)
    assert result.exit_code == code
    assert result.stderr == f"error: {error.message}\n  fix: {error.hint}\n"
    assert result.stdout == ""


def test_unexpected_error_exits_1_with_one_line_and_no_traceback() -> None:
    result = boundary(RuntimeError("it broke\nsecond line"))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "unexpected error: RuntimeError: it broke",
        "  fix: run again with PGPOLL_DEBUG=1 for details, and report it if it persists",
    ]
    assert "Traceback" not in result.output


def test_error_messages_are_redacted_even_with_debug_traceback() -> None:
    error = errors.SourceError("failed on postgresql://u:hunter22@h/db", "retry host=h password=hunter22")
    plain = boundary(error)
    assert plain.exit_code == 4
    assert "hunter22" not in plain.output
    assert "postgresql://u:***@h/db" in plain.stderr and "password=***" in plain.stderr
    runner = CliRunner()

    @click.group(cls=PgpollGroup)
    def group() -> None:
        pass

    @group.command()
    def boom() -> None:
        raise RuntimeError("dsn postgresql://u:hunter22@h/db")

    debug = runner.invoke(group, ["boom"], env={"PGPOLL_DEBUG": "1"}, catch_exceptions=False)
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr
    assert "hunter22" not in debug.output


def test_report_error_returns_the_exit_code() -> None:
    assert report_error(errors.WalLevelError("wal_level is replica")) == exitcodes.SOURCE


def test_help_lists_every_exit_code() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for code, meaning in exitcodes.EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in text


def test_usage_error_exits_2() -> None:
    result = CliRunner().invoke(cli, ["slot", "create", "ok_name"])
    assert result.exit_code == 2
    assert "Missing option '--plugin'" in result.stderr


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, env=clean, timeout=60)


@pytest.fixture(scope="module")
def console_script() -> Path:
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"console script not installed at {CONSOLE_SCRIPT} (pip install -e .)")
    return CONSOLE_SCRIPT


def test_console_script_version_and_help(console_script: Path) -> None:
    from pgpoll import __version__

    version = run_script("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"pgpoll, version {__version__}"
    help_ = run_script("slot", "--help")
    assert help_.returncode == 0
    assert all(cmd in help_.stdout for cmd in ("create", "drop", "list", "peek", "advance"))


def test_console_script_error_paths(console_script: Path, db: Any) -> None:
    name = db.slot_name()
    env = {"PGPOLL_DSN": db.dsn}
    assert run_script("slot", "create", name, "--plugin", "pgoutput", env=env).returncode == 0
    dup = run_script("slot", "create", name, "--plugin", "pgoutput", env=env)
    assert dup.returncode == 4
    assert dup.stderr.splitlines()[0] == f'error: replication slot "{name}" already exists'
    bad = run_script("slot", "peek", "Bad-Name", env=env)
    assert bad.returncode == 2
    assert "slot names may contain only lower-case letters, digits and underscores" in bad.stderr
    wrong = run_script("slot", "list", "--dsn", db.dsn.replace(db.server.password, "not-the-pw-123"))
    assert wrong.returncode == 4
    assert "password authentication failed" in wrong.stderr
    assert "not-the-pw-123" not in wrong.stdout + wrong.stderr
    for proc in (dup, bad, wrong):
        assert "Traceback" not in proc.stderr and db.server.password not in proc.stdout + proc.stderr
    listed = run_script("slot", "list", env=env)
    assert listed.returncode == 0 and name in listed.stdout
