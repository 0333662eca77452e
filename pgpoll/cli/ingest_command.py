"""``pgpoll ingest`` (and ``spark-submit jobs/ingest.py``, which runs this same command)."""

from __future__ import annotations

import logging

import click

from pgpoll.cli.job_runner import run_job
from pgpoll.cli.options import ByteSize, csv_values, dsn_option, pushgateway_option
from pgpoll.cli.progress import Progress
from pgpoll.ingest.batch_bounds import BATCH_WAL
from pgpoll.ingest.decode_ranges import DECODE_PARALLELISM, PARALLELISM_ENV
from pgpoll.ingest.run import IngestOptions, RunSummary, run_ingest


@click.command("ingest")
@click.option("--slot", required=True, help="Replication slot to drain.")
@click.option("--output", required=True, help="Output path: a local path or file: URI, an object store (s3://, gs://, az://) "
                                                 "or another Hadoop filesystem URI (hdfs://).")
@click.option("--plugin", type=click.Choice(["auto", "test_decoding", "pgoutput"]), default="auto", show_default=True,
              help="Output plugin; auto reads it from the slot.")
@click.option("--publication", "publications", multiple=True, callback=csv_values,
              help="Publication(s) for pgoutput (comma list or repeated).")
@click.option("--tables", multiple=True, callback=csv_values, metavar="PATTERN,...",
              help="Keep only these tables (shell patterns over schema.table).")
@click.option("--exclude-tables", multiple=True, callback=csv_values, metavar="PATTERN,...", help="Leave out these tables.")
@click.option("--max-changes", type=click.IntRange(min=1), default=None, help="Stop after about this many changes.")
@click.option("--max-batches", type=click.IntRange(min=1), default=None, help="Stop after this many batches.")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=None, help="Start no new batch after this many seconds.")
@click.option("--batch-changes", type=click.IntRange(min=1), default=None,
              help="Also peek at most about this many rows per batch (upto_nchanges; one transaction more at most). "
                   "Default: no row limit, batches are bounded by --batch-wal.")
@click.option("--batch-wal", type=ByteSize(), default=BATCH_WAL, envvar="PGPOLL_BATCH_WAL", show_envvar=True,
              help="Peek at most about this much WAL per batch (upto_lsn; a larger transaction still makes one batch). "
                   "0: no WAL bound.  [default: 1GB]")
@click.option("--decode-parallelism", type=click.IntRange(min=1), default=DECODE_PARALLELISM, envvar=PARALLELISM_ENV,
              show_default=True, show_envvar=True,
              help="Parts of a large batch the server decodes at once: the slot up to a split, a temporary copy of "
                   "it from there (each copy takes a free max_replication_slots entry for the batch). 1: the slot alone.")
@click.option("--typed-tables", is_flag=True, default=False, envvar="PGPOLL_TYPED_TABLES",
              help="Also write each table's typed changes under OUTPUT/tables/<schema>.<table>/ (same commit).")
@click.option("--row-filter", "row_filters", multiple=True, metavar="'SCHEMA.TABLE: (EXPR)'",
              help="test_decoding only: keep the changes a publication row filter would (repeatable; ORed per table).")
@dsn_option
@pushgateway_option
def command(slot: str, output: str, plugin: str, publications: tuple[str, ...], tables: tuple[str, ...],
            exclude_tables: tuple[str, ...], max_changes: int | None, max_batches: int | None,
            max_seconds: float | None, batch_changes: int | None, batch_wal: int, decode_parallelism: int, typed_tables: bool,
            row_filters: tuple[str, ...], dsn: str | None, pushgateway: str | None) -> None:
    """Drain SLOT into Parquet under OUTPUT, advancing the slot only after each batch is committed.

    Prints one JSON line (the run summary) on stdout; logs go to stderr.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # py4j logs its shutdown at INFO after the summary; under spark-submit stderr joins stdout
    logging.getLogger("py4j").setLevel(logging.WARNING)
    opts = IngestOptions(
        slot=slot, output=output, plugin=plugin, publications=publications, tables=tables,
        exclude_tables=exclude_tables, max_changes=max_changes, max_batches=max_batches,
        max_seconds=max_seconds, batch_changes=batch_changes, batch_wal=batch_wal, typed_tables=typed_tables,
        decode_parallelism=decode_parallelism, row_filters=row_filters, dsn=dsn, pushgateway=pushgateway,
    )
    progress = Progress()
    run_job(
        lambda stop: run_ingest(
            opts, stop=stop, show_progress=progress.update if progress.enabled else None,
            on_batch=lambda s: progress.update(
                f"{s.batches} batch(es), {s.changes:,} change(s), slot at {s.last_lsn}", force=True),
        ),
        lambda status, code, seconds: RunSummary(slot=slot, status=status, exit_code=code, seconds=seconds),
        progress=progress,
        cut_short="nothing of the unfinished step was published",
        interrupted=lambda summary: (f"{summary.batches} batch(es) committed; the unfinished batch was abandoned "
                                     "(the next run reads it again)"),
    )
