"""``pgpoll check``: preflight of the source server."""

from __future__ import annotations

import click

from pgpoll.cli.options import dsn_option, json_option, target
from pgpoll.cli.output import echo_json, echo_table
from pgpoll.errors import SourceError
from pgpoll.source.connection import connect
from pgpoll.source.failover import failover_checks
from pgpoll.source.preflight import FAIL, run_checks


@click.command()
@click.option("--plugin", type=click.Choice(["test_decoding", "pgoutput"]), default=None,
              help="Also check that this output plugin is available.")
@click.option("--publication", default=None, help="Also check that this publication exists.")
@json_option
@dsn_option
def check(plugin: str | None, publication: str | None, as_json: bool, dsn: str | None) -> None:
    """Check that the server is ready for pgpoll; exit 4 with the fix when it is not."""
    tgt = target(dsn)
    conn = connect(tgt)
    try:
        items = run_checks(conn, plugin=plugin, publication=publication)
        items += failover_checks(conn)  # PostgreSQL 17+: synchronized_standby_slots; a standby's slot sync
    finally:
        conn.close()
    if as_json:
        for item in items:
            echo_json(item.as_json())
    else:
        click.echo(f"server: {tgt.redacted()}")
        echo_table(["check", "status", "value", "fix"], [[i.name, i.status, i.value, i.fix] for i in items])
    failed = [i for i in items if i.status == FAIL]
    if failed:
        first = failed[0]
        error_type = first.error or SourceError
        raise error_type(f"{len(failed)} check(s) failed, first: {first.name} is {first.value}", first.fix)
