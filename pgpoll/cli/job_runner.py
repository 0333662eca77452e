"""Running a long job from the CLI: signals, progress, the error boundary and the one JSON summary line.

``ingest`` and ``snapshot`` behave alike at their edges: SIGINT/SIGTERM ask
the job to stop at its next safe point (exit 130/143, what finished is kept),
an error prints its one- or two-line message and still ends with a summary
line (status ``error`` and the exit code) so that a scheduler reading stdout
always finds one. This module is that behaviour, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import click

from pgpoll import stopping
from pgpoll.cli.boundary import report_error
from pgpoll.cli.progress import Progress
from pgpoll.stopping import StopRequest


class Summary(Protocol):
    """What a job's run summary offers here."""

    @property
    def status(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    def to_json(self) -> str: ...


S = TypeVar("S", bound=Summary)


def run_job(
    run: Callable[[StopRequest], S],
    failed: Callable[[str, int, float], Summary],
    *,
    progress: Progress,
    cut_short: str,
    interrupted: Callable[[S], str],
) -> None:
    """Run ``run(stop)``, print its summary line and exit with its code.

    ``failed(status, exit_code, seconds)`` builds the summary of a run that
    raised; ``cut_short`` says what a signal that interrupted a step left
    behind, ``interrupted(summary)`` what a run that stopped at a safe point kept.
    """
    started = time.monotonic()
    stop = StopRequest()
    restore = stopping.install(stop)
    try:
        summary = run(stop)
    except Exception as error:
        progress.done()
        if stop.requested:  # the signal cut a step short (connecting, recovery): say so, not the side effect
            click.echo(f"interrupted by signal {stop.signum}: {cut_short}", err=True)
            code, status = stop.exit_code, "interrupted"
        else:
            code, status = report_error(error), "error"
        click.echo(failed(status, code, round(time.monotonic() - started, 3)).to_json())
        raise SystemExit(code) from None
    finally:
        restore()
    progress.done()
    if summary.status == "interrupted":
        click.echo(f"interrupted by signal {stop.signum}: {interrupted(summary)}", err=True)
    click.echo(summary.to_json())
    if summary.exit_code:
        raise SystemExit(summary.exit_code)
