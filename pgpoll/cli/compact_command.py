"""``pgpoll compact``: merge runs of small committed batches into files of about a target size (no Spark, no server).

The work is :mod:`pgpoll.housekeeping.compact`'s; this parses, runs it and prints its JSON summary.
"""

from __future__ import annotations

import click

from pgpoll.cli.options import ByteSize
from pgpoll.cli.output import echo_json
from pgpoll.housekeeping.compact import GRACE, MIN_AGE, CompactOptions, compact


@click.command("compact")
@click.option("--output", required=True, help="The output path pgpoll ingest writes (a local path, file: URI or "
              "object store: s3://, gs://, az://).")
@click.option("--target-size", type=ByteSize(), default="128MB", show_default=True,
              help="Merge consecutive batches into files of about this size (the change log's bytes; typed tables' "
                   "files follow the same batches). A batch already this large is left alone.")
@click.option("--min-age", type=click.FloatRange(min=0), default=MIN_AGE, show_default=True, metavar="SECONDS",
              help="Merge only batches committed at least this long ago (the newest batch is never merged).")
@click.option("--grace", type=click.FloatRange(min=0), default=GRACE, show_default=True, metavar="SECONDS",
              help="Keep the files a merge replaced this long after it, for readers that listed them before; a "
                   "later run deletes them (0: this run does).")
def command(output: str, target_size: int, min_age: float, grace: float) -> None:
    """Merge runs of small committed batches of OUTPUT (changes/ and tables/) into files of about --target-size.

    Fenced like every writer of the output: one compaction at a time (exit 3 when another holds it), never
    beside pgpoll retain (exit 3 while it runs), beside a running ingest, which it never stops. Readers see a
    merge at once through the change log's Delta table, pgpoll.reader, the Spark reader and materialize; a
    plain directory read of changes/ may see a merged partition and the ones it replaces together until they
    are deleted (docs/how-to/compact.md).
    Prints one JSON summary: files and bytes before and after, the records covered.
    """
    if target_size <= 0:
        raise click.BadParameter("must be more than 0 bytes, e.g. 128MB", param_hint="--target-size")
    result = compact(CompactOptions(output=output, target_size=target_size, min_age=min_age, grace=grace))
    echo_json(result.as_json())
