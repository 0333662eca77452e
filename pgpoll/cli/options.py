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


def pushgateway_option(func: F) -> F:
    """``--pushgateway URL`` (env ``PGPOLL_PUSHGATEWAY``): push the run's metrics there at its end."""
    return click.option(
        "--pushgateway",
        envvar="PGPOLL_PUSHGATEWAY",
        show_envvar=True,
        default=None,
        metavar="URL",
        help="Push the run's metrics to this Prometheus Pushgateway at its end (failed runs too; a push that fails "
             "is a warning, not a failure). Grouped by job, slot and output.",
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


_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30, "gib": 1 << 30,
          "tb": 1 << 40, "tib": 1 << 40}


class ByteSize(click.ParamType[int]):
    """A number of bytes: ``1073741824``, ``256MB``, ``1GB`` (units of 1024, as PostgreSQL reads memory settings)."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().replace(" ", "")
        number = text.rstrip("kKmMgGtTiIbB")
        unit = text[len(number):].lower()
        if not number.isdigit() or unit not in _UNITS:
            self.fail(f"{value!r} is not a size: give bytes, or a number with kB, MB, GB or TB (e.g. 256MB)", param, ctx)
        return int(number) * _UNITS[unit]
