"""``pgpoll materialize`` (and ``spark-submit jobs/materialize.py``, which runs this same command)."""

from __future__ import annotations

import json
import logging
import time

import click

from pgpoll import stopping
from pgpoll.cli import exitcodes
from pgpoll.cli.boundary import report_error
from pgpoll.cli.options import csv_values, pushgateway_option
from pgpoll.materialize.delta.state import DeltaMaterializer
from pgpoll.materialize.driver.run import requested_engine
from pgpoll.materialize.iceberg.state import IcebergMaterializer
from pgpoll.materialize.maintenance import DEFAULT_RETENTION, parse_retention
from pgpoll.materialize.run import MaterializeOptions, Materializer, TableState, run_materialize
from pgpoll.materialize.run_types import REFUSED, refused_error
from pgpoll.spark.session import debug_requested
from pgpoll.stopping import StopRequest

FORMATS: dict[str, type[Materializer]] = {"parquet": Materializer, "delta": DeltaMaterializer, "iceberg": IcebergMaterializer}


def _cancel_spark_jobs() -> None:
    """On SIGINT/SIGTERM: cancel the running Spark job (quietly: Spark logs its own cancellation as errors)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        if not debug_requested():
            context.setLogLevel("OFF")
        context.cancelAllJobs()


def summary_json(status: str, exit_code: int, states: list[TableState], seconds: float, fmt: str) -> str:
    """The run's last JSON line under ``--json``: status, exit code, tables (built and refused), rows, seconds,
    format."""
    refused = [s.table for s in states if s.mode == REFUSED]
    return json.dumps({"status": status, "exit_code": exit_code, "tables": len(states),
                       "built": len(states) - len(refused), "refused": refused,
                       "rows": sum(s.rows for s in states), "seconds": round(seconds, 3), "format": fmt},
                      sort_keys=True)


@click.command("materialize")
@click.option("--output", required=True, help="The output path pgpoll ingest --typed-tables writes.")
@click.option("--tables", multiple=True, callback=csv_values, metavar="PATTERN,...",
              help="Only these tables (shell patterns over schema.table).")
@click.option("--exclude-tables", multiple=True, callback=csv_values, metavar="PATTERN,...", help="Leave out these tables.")
@click.option("--to", "dest", default=None, metavar="DEST", help="Where the state goes (default OUTPUT/state).")
@click.option("--full", is_flag=True, default=False,
              help="Rebuild from every batch instead of the previous state (a table whose early batches pgpoll retain "
                   "removed: on its snapshot, or refused with exit 2 when it has none that holds them).")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="parquet", show_default=True,
              help="parquet: a directory of Parquet files per table; delta: a Delta Lake table per table; "
                   "iceberg: an Iceberg table per table, in a catalog (--catalog).")
@click.option("--catalog", default=None, metavar="NAME", envvar="PGPOLL_ICEBERG_CATALOG", show_envvar=True,
              help="--format iceberg: the pyiceberg catalog NAME (.pyiceberg.yaml or PYICEBERG_CATALOG__NAME__*); "
                   "default for a local DEST: a SQLite catalog in DEST/_catalog.db with DEST as the warehouse.")
@click.option("--state-retention", default=DEFAULT_RETENTION, show_default=True, metavar="AGE",
              envvar="PGPOLL_STATE_RETENTION", show_envvar=True,
              help="--format delta and iceberg: how long superseded versions and snapshots stay readable (time "
                   "travel, readers started before a run), as 7d, 168h or 90m; older ones are removed by the run "
                   "(Delta: checkpoint, log clean-up and vacuum every 10 versions; Iceberg: snapshots expired). "
                   "off: no maintenance.")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="One JSON line per table, then a summary line (status, exit_code, tables, rows, seconds, format).")
@pushgateway_option
def command(output: str, tables: tuple[str, ...], exclude_tables: tuple[str, ...], dest: str | None, full: bool,
            fmt: str, catalog: str | None, state_retention: str, as_json: bool, pushgateway: str | None) -> None:
    """Write the current state of each captured table under DEST/<schema>.<table>/ (Parquet or Delta Lake), or as
    Iceberg tables in a catalog."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if catalog and fmt != "iceberg":
        raise click.UsageError("--catalog applies to --format iceberg only")
    try:
        retention = parse_retention(state_retention)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--state-retention") from None
    opts = MaterializeOptions(output=output, tables=tables, exclude_tables=exclude_tables, to=dest, full=full,
                              catalog=catalog or None, state_retention_hours=retention, pushgateway=pushgateway)
    started = time.monotonic()
    stop = StopRequest()
    restore = stopping.install(stop)
    stop.on_request(_cancel_spark_jobs)
    try:
        requested_engine()  # a bad PGPOLL_MATERIALIZE_ENGINE: exit 2 before Spark starts
        states = run_materialize(opts, None, materializer=FORMATS[fmt], stop=stop)  # Spark starts only if needed
    except Exception as error:
        if stop.requested:  # cancelled mid-table or stopped between tables: what was committed stays
            click.echo(f"interrupted by signal {stop.signum}: tables finished before it keep their new state; "
                       "the unfinished table keeps its previous one", err=True)
            code, status = stop.exit_code, "interrupted"
        else:
            code = report_error(error)
            status = "busy" if code == exitcodes.SLOT_BUSY else "error"
        if as_json:
            click.echo(summary_json(status, code, [], time.monotonic() - started, fmt))
        raise SystemExit(code) from None
    finally:
        restore()
    if stop.requested:  # the signal came when no Spark job was running: stopped at the end, the next safe point
        click.echo(f"interrupted by signal {stop.signum}: every table listed was written whole", err=True)
    for st in states:
        if as_json:
            click.echo(st.to_json())
        else:
            if st.mode == REFUSED:
                click.echo(f"{st.table}: refused, not built -> {st.path}")  # why: in the error after the list
                continue
            version = f", version {st.version}" if st.version is not None else ""
            snap = f", on snapshot {st.snapshot['id']}" if st.snapshot else ""
            click.echo(f"{st.table}: {st.rows} row(s) as of {st.position} ({st.mode}{version}{snap}) -> {st.path}")
            for w in st.warnings:
                click.echo(f"  warning: {w}", err=True)
    status, code = ("interrupted", stop.exit_code) if stop.requested else ("ok", 0)
    refusal = refused_error(states) if code == 0 else None
    if refusal is not None:  # the covered tables were built; the refused ones are named, then exit 2
        status, code = "refused", report_error(refusal)
    if as_json:
        click.echo(summary_json(status, code, states, time.monotonic() - started, fmt))
    if code:
        raise SystemExit(code)
