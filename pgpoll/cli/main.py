"""The ``pgpoll`` command group and its error boundary.

Commands raise pgpoll errors; :class:`PgpollGroup` turns them into a short
message on stderr (what failed, then the fix) and a documented exit code. No
traceback is printed unless ``PGPOLL_DEBUG=1``; no password is ever printed.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from pgpoll import __version__
from pgpoll.cli import exitcodes
from pgpoll.cli.boundary import report_error
from pgpoll.spark.session import VERBOSE_ENV


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
        batches_command,
        check_command,
        compact_command,
        decode_command,
        ingest_command,
        materialize_command,
        publication_commands,
        report_command,
        resync_command,
        retain_command,
        slot_commands,
        snapshot_command,
        status_command,
    )

    cli.add_command(check_command.check)
    cli.add_command(ingest_command.command)
    cli.add_command(materialize_command.command)
    cli.add_command(decode_command.command)
    cli.add_command(slot_commands.slot)
    cli.add_command(publication_commands.publication)
    cli.add_command(status_command.command)
    cli.add_command(batches_command.command)
    cli.add_command(snapshot_command.command)
    cli.add_command(report_command.command)
    cli.add_command(resync_command.command)
    cli.add_command(retain_command.command)
    cli.add_command(compact_command.command)
    _add_verbose(cli)


def _set_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        os.environ[VERBOSE_ENV] = "1"  # read where Spark starts (pgpoll.spark.session)
        logging.getLogger("pgpoll").setLevel(logging.DEBUG)


def _add_verbose(group: click.Group) -> None:
    """Give every command ``--verbose``: Spark's and Java's own log lines, and pgpoll's debug lines."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            _add_verbose(command)
        elif not any(p.name == "verbose" for p in command.params):
            command.params.append(
                click.Option(["--verbose"], is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose,
                             help="Also show Spark's and Java's log lines, and pgpoll's debug lines.")
            )


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="pgpoll", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as error:  # pragma: no cover - PgpollGroup catches first
        sys.exit(report_error(error))
