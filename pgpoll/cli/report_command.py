"""``pgpoll report``: one self-contained HTML page of an output's batches, gaps, runs, snapshots and (with a DSN) slot."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from pgpoll.cli.options import dsn_option, target
from pgpoll.observe.report import render
from pgpoll.observe.report_data import read_output
from pgpoll.sink.stores.filesystem import check_readable, open_output
from pgpoll.source.connection import redact


@click.command("report")
@click.option("--output", required=True, metavar="PATH",
              help="The output path pgpoll ingest writes (a local path, file: URI or object store: s3://, gs://, az://).")
@click.option("--html", "html_path", default="pgpoll-report.html", show_default=True, metavar="FILE",
              help="Where to write the page (- for stdout).")
@dsn_option
def command(output: str, html_path: str, dsn: str | None) -> None:
    """Write one HTML page about OUTPUT: changes, throughput and lag at commit over time, the batches with
    the largest lag, the largest batches, the gaps, the runs (per job: how many failed, how long they took;
    the slowest runs, the failed ones with their exit codes), the snapshots and, with a DSN, the slot's
    state now.

    The page needs no server and no internet (its chart library is inline). Reads the commit log, the run
    history and the snapshots' metadata, no data file and no Spark; connects to the database only when a DSN is given
    (--dsn or PGPOLL_DSN).
    """
    fs = open_output(output)
    check_readable(fs)  # an unreachable store, a wrong secret: exit 5 in seconds
    data = read_output(fs, redact(output), datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    if dsn:
        from pgpoll.status import collect_status

        data.slots = [s.as_json() for s in collect_status(target(dsn), output=output).slots]
    page = render(data)
    if html_path == "-":
        click.echo(page, nl=False)
        return
    Path(html_path).write_text(page, encoding="utf-8")
    click.echo(f"{html_path}: {len(data.batches)} batch(es), {len(data.snapshots)} snapshot(s)"
               + (f", {len(data.slots)} slot(s)" if data.slots else ""))
