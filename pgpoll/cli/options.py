"""Option decorators shared by commands; each option can come from an environment variable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from pgpoll.source.connection import ConnectionTarget, resolve_dsn

F = Callable[..., Any]


def dsn_option(func: F) -> F:
    """``--dsn`` (env ``PGPOLL_DSN``; else libpq's PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD)."""
    return click.option(
        "--dsn",
        envvar="PGPOLL_DSN",
        show_envvar=True,
        default=None,
        metavar="DSN",
        help="libpq URI or key=value string, or a SQLAlchemy URL. Defaults to PGPOLL_DSN, then the libpq PG* variables.",
    )(func)


def target(dsn: str | None) -> ConnectionTarget:
    """Resolve the connection target from the option value."""
    return resolve_dsn(dsn)


def json_option(func: F) -> F:
    """``--json``: machine-readable output, one object per line."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(func)


def csv_values(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Callback for repeatable options that also take comma lists (``--tables a,b --tables c``)."""
    return tuple(p.strip() for v in value for p in v.split(",") if p.strip())
