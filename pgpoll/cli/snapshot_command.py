"""``pgpoll snapshot`` (and ``spark-submit jobs/snapshot.py``, which runs this same command)."""

from __future__ import annotations

import logging
import re

import click

from pgpoll.cli.job_runner import run_job
from pgpoll.cli.options import csv_values, dsn_option, pushgateway_option
from pgpoll.cli.progress import Progress
from pgpoll.snapshot.run import SnapshotOptions, SnapshotSummary, run_snapshot

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """``5s``, ``500ms``, ``2min``, ``1h`` or plain seconds -> seconds."""
    m = _DURATION.match(str(value))
    if not m:
        raise click.BadParameter(f"{value!r} is not a duration (e.g. 5s, 500ms, 2min, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


@click.command("snapshot")
@click.option("--slot", required=True, help="Replication slot the snapshot is for (must exist and not be lost; never touched).")
@click.option("--output", required=True, help="Output path (the one ingest writes): a local path, file: URI or an object store "
                                                 "(s3://, gs://, az://).")
@click.option("--publication", "publications", multiple=True, callback=csv_values,
              help="Publication(s) of a pgoutput slot: their tables, column lists and row filters.")
@click.option("--tables", multiple=True, callback=csv_values, metavar="PATTERN,...",
              help="Only these tables (shell patterns over schema.table).")
@click.option("--exclude-tables", multiple=True, callback=csv_values, metavar="PATTERN,...", help="Leave out these tables.")
@click.option("--row-filter", "row_filters", multiple=True, metavar="'SCHEMA.TABLE: (EXPR)'",
              help="test_decoding only: keep the rows ingest's --row-filter keeps (repeatable; ORed per table).")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Rows per chunk (about, for large tables: cut at their key's statistics; one task reads one chunk at a time).")
@click.option("--chunk-seconds", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="About how long one chunk's read (and snapshot) may last: wide rows make smaller chunks.")
@click.option("--mode", type=click.Choice(["auto", "shared"]), default="auto", show_default=True,
              help="auto: one short snapshot per chunk wherever materialize can place keys; shared: every table "
                   "under one exported snapshot (holds back vacuum for the table's whole read).")
@click.option("--parallelism", type=click.IntRange(min=1), default=None,
              help="Chunks read at once, each with its own connection [default: Spark's default parallelism, at most 8].")
@click.option("--lock-timeout", "lock_timeout_s", default="5s", show_default=True, callback=_seconds,
              help="How long a chunk waits for its ACCESS SHARE lock before trying again (a few times, then exit 4).")
@click.option("--wait-timeout", "wait_timeout_s", default="600", show_default=True, callback=_seconds,
              help="Seconds to wait for the transactions in progress in the chunks' snapshots to finish.")
@click.option("--shared-snapshot-timeout", "shared_snapshot_timeout_s", default="3600", show_default=True,
              callback=_seconds,
              help="Longest a table read under one shared snapshot may hold it (it holds back vacuum meanwhile).")
@click.option("--json", "as_json", is_flag=True, help="No progress line on a terminal (the summary is JSON anyway).")
@dsn_option
@pushgateway_option
def command(slot: str, output: str, publications: tuple[str, ...], tables: tuple[str, ...],
            exclude_tables: tuple[str, ...], row_filters: tuple[str, ...], chunk_rows: int, chunk_seconds: float,
            mode: str, parallelism: int | None,
            lock_timeout_s: float, wait_timeout_s: float, shared_snapshot_timeout_s: float, as_json: bool,
            dsn: str | None, pushgateway: str | None) -> None:
    """Read the current rows of the captured tables into OUTPUT/snapshots/<id>/ (the typed tables' form).

    Rerun with the same arguments after an interruption: only the missing
    chunks are read. Prints one JSON line (the run summary) on stdout.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    opts = SnapshotOptions(
        slot=slot, output=output, publications=publications, tables=tables, exclude_tables=exclude_tables,
        row_filters=row_filters, chunk_rows=chunk_rows, chunk_seconds=chunk_seconds, mode=mode,
        parallelism=parallelism, lock_timeout_s=lock_timeout_s,
        wait_timeout_s=wait_timeout_s, shared_snapshot_timeout_s=shared_snapshot_timeout_s, dsn=dsn,
        pushgateway=pushgateway,
    )
    progress = Progress()
    if as_json:
        progress.enabled = False
    run_job(
        lambda stop: run_snapshot(opts, stop=stop, show_progress=progress.update if progress.enabled else None),
        lambda status, code, seconds: SnapshotSummary(slot=slot, status=status, exit_code=code, seconds=seconds),
        progress=progress,
        cut_short="finished chunks are kept; rerun to resume",
        interrupted=lambda summary: (f"{summary.chunks_read} chunk(s) read by this run are kept; rerun the same "
                                     "command to read the others"),
    )
