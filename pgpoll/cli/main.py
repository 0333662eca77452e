"""The ``pgpoll`` command group and its error boundary.

Commands raise pgpoll errors; :class:`PgpollGroup` turns them into a short
message on stderr (what failed, then the fix) and a documented exit code. No
traceback is printed unless ``PGPOLL_DEBUG=1``; no password is ever printed.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click

from pgpoll import __version__
from pgpoll.cli import exitcodes
from pgpoll.errors import PgpollError
from pgpoll.source.connection import redact


def report_error(error: BaseException) -> int:
    """Print ``error`` for a person (redacted) and return its exit code."""
    code = exitcodes.exit_code_for(error)
    if isinstance(error, PgpollError):
        click.echo(redact(f"error: {error.message}"), err=True)
        if error.hint:
            click.echo(redact(f"  fix: {error.hint}"), err=True)
    else:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        click.echo(redact(f"unexpected error: {type(error).__name__}: {first}"), err=True)
        click.echo("  fix: run again with PGPOLL_DEBUG=1 for details, and report it if it persists", err=True)
    if os.environ.get("PGPOLL_DEBUG") == "1":
        click.echo(redact("".join(traceback.format_exception(error))), err=True)
    return code


class PgpollGroup(click.Group):
    """A click group that maps pgpoll errors to exit codes at the boundary."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            raise
        except Exception as error:  # the boundary: everything becomes a message and a code
            ctx.exit(report_error(error))


EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in exitcodes.EXIT_CODES.items())


@click.group(cls=PgpollGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pgpoll")
def cli() -> None:
    """pgpoll: change data capture from PostgreSQL logical replication slots into Parquet, on Spark."""


def _register() -> None:
    from pgpoll.cli import (
        check_command,
        decode_command,
        ingest_command,
        materialize_command,
        publication_commands,
        slot_commands,
        status_command,
    )

    cli.add_command(check_command.check)
    cli.add_command(ingest_command.command)
    cli.add_command(materialize_command.command)
    cli.add_command(decode_command.command)
    cli.add_command(slot_commands.slot)
    cli.add_command(publication_commands.publication)
    cli.add_command(status_command.command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="pgpoll", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as error:  # pragma: no cover - PgpollGroup catches first
        sys.exit(report_error(error))
