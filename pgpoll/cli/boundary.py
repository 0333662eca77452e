"""The CLI's error boundary: an error becomes a short message and a documented exit code.

Kept apart from :mod:`pgpoll.cli.main` (which imports every command) so that a
command can report an error itself — ``ingest`` prints its summary line after
the message — without importing the group that imports it.
"""

from __future__ import annotations

import os
import traceback

import click

from pgpoll.cli import exitcodes
from pgpoll.errors import PgpollError, first_line
from pgpoll.source.connection import redact


def report_error(error: BaseException) -> int:
    """Print ``error`` for a person (redacted) and return its exit code."""
    code = exitcodes.exit_code_for(error)
    if isinstance(error, PgpollError):
        click.echo(redact(f"error: {error.message}"), err=True)
        if error.hint:
            click.echo(redact(f"  fix: {error.hint}"), err=True)
    else:
        first = first_line(error)
        click.echo(redact(f"unexpected error: {type(error).__name__}: {first}"), err=True)
        click.echo("  fix: run again with PGPOLL_DEBUG=1 for details, and report it if it persists", err=True)
    if os.environ.get("PGPOLL_DEBUG") == "1":
        click.echo(redact("".join(traceback.format_exception(error))), err=True)
    return code
