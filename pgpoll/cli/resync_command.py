"""``pgpoll resync``: go on with the same output after its slot was moved past it, or after an unsafe failover
(see :mod:`pgpoll.snapshot.resync`)."""

from __future__ import annotations

import logging

import click

from pgpoll.cli.job_runner import run_job
from pgpoll.cli.options import csv_values, dsn_option
from pgpoll.cli.progress import Progress
from pgpoll.snapshot.resync import ResyncSummary, run_resync
from pgpoll.snapshot.run import SnapshotOptions


@click.command("resync")
@click.option("--slot", required=True, help="The slot that feeds the output (as it is now: recreated, or moved on).")
@click.option("--output", required=True, help="The output path ingest writes (a local path, file: URI or object store).")
@click.option("--publication", "publications", multiple=True, callback=csv_values,
              help="Publication(s) of a pgoutput slot: the tables to snapshot (as for ingest and snapshot).")
@click.option("--parallelism", type=click.IntRange(min=1), default=None,
              help="Snapshot chunks read at once [default: as pgpoll snapshot].")
@click.option("--json", "as_json", is_flag=True, help="No progress line on a terminal (the summary is JSON anyway).")
@dsn_option
def command(slot: str, output: str, publications: tuple[str, ...], parallelism: int | None, as_json: bool,
            dsn: str | None) -> None:
    """Mark the gap between the output and its slot in the commit log, then snapshot every captured table.

    ingest can run again as soon as the gap is marked; materialize builds each
    table across the gap only from the snapshot taken after it. On another
    database system or a timeline that left the output's before its mark (an
    unsafe failover), it first brings the server's WAL past the mark
    (pg_switch_wal, at most 1 GiB) and waits until the transactions the slot
    will skip are visible, so that the snapshot holds them; materialize then
    rebuilds every state from this server. Rerun after an interruption: the
    snapshot resumes. Prints one JSON line (the summary).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    opts = SnapshotOptions(slot=slot, output=output, publications=publications, parallelism=parallelism, dsn=dsn)
    progress = Progress()
    if as_json:
        progress.enabled = False
    run_job(
        lambda stop: run_resync(opts, stop=stop, show_progress=progress.update if progress.enabled else None),
        lambda status, code, seconds: ResyncSummary(slot=slot, status=status, exit_code=code, seconds=seconds),
        progress=progress,
        cut_short="the gap, once marked, stays marked; rerun to finish the snapshot",
        interrupted=lambda summary: "rerun the same command: the snapshot resumes where it stopped",
    )
