"""``pgpoll materialize`` (and ``spark-submit jobs/materialize.py``, which runs this same command)."""

from __future__ import annotations

import logging

import click

from pgpoll.cli.main import report_error
from pgpoll.materialize.run import MaterializeOptions, run_materialize


def _csv(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p.strip() for v in value for p in v.split(",") if p.strip())


@click.command("materialize")
@click.option("--output", required=True, help="The output path pgpoll ingest --typed-tables writes.")
@click.option("--tables", multiple=True, callback=_csv, metavar="PATTERN,...", help="Only these tables (shell patterns over schema.table).")
@click.option("--exclude-tables", multiple=True, callback=_csv, metavar="PATTERN,...", help="Leave out these tables.")
@click.option("--to", "dest", default=None, metavar="DEST", help="Where the state goes (default OUTPUT/state).")
@click.option("--full", is_flag=True, default=False, help="Rebuild from every batch instead of the previous state.")
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON line per table.")
def command(output: str, tables: tuple[str, ...], exclude_tables: tuple[str, ...], dest: str | None, full: bool,
            as_json: bool) -> None:
    """Write the current state of each captured table as Parquet under DEST/<schema>.<table>/."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    opts = MaterializeOptions(output=output, tables=tables, exclude_tables=exclude_tables, to=dest, full=full)
    try:
        states = run_materialize(opts)
    except Exception as error:
        raise SystemExit(report_error(error))
    for st in states:
        if as_json:
            click.echo(st.to_json())
        else:
            click.echo(f"{st.table}: {st.rows} row(s) as of {st.position} ({st.mode}) -> {st.path}")
            for w in st.warnings:
                click.echo(f"  warning: {w}", err=True)
