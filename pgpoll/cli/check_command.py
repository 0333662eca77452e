"""``pgpoll check``: preflight of the source server."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from pgpoll.cli.options import dsn_option, json_option, target
from pgpoll.cli.output import echo_json, echo_table
from pgpoll.errors import ConfigError, SourceError
from pgpoll.ingest.decode_ranges import DECODE_PARALLELISM, PARALLELISM_ENV
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.failover import failover_checks, standby_capture_checks
from pgpoll.source.names import check_slot_name
from pgpoll.source.preflight import FAIL, OK, WARN, CheckItem, run_checks
from pgpoll.source.server_identity import HISTORY_GRANT, can_read_timeline_history
from pgpoll.source.slot_copies import copy_check
from pgpoll.status import collect_status


def _slot_against_output(tgt: ConnectionTarget, slot: str, output: str) -> CheckItem:
    """The gap check ``ingest`` runs before it reads (:mod:`pgpoll.source.slot_gap`), as one check item."""
    status = collect_status(tgt, slot=check_slot_name(slot), output=output).slots[0]
    verdict = status.verdict
    assert verdict is not None
    value = f"{verdict.position} (slot at {verdict.slot.confirmed_flush_lsn}, output at {verdict.output.high_water_mark})"
    if verdict.error is None:
        return CheckItem("slot_vs_output", OK, value)
    return CheckItem("slot_vs_output", FAIL, value, verdict.error.hint or "", type(verdict.error))


def _timeline_history(conn: Any) -> CheckItem:
    """Whether the role can read timeline history: without it, the first run after any failover exits 4."""
    if can_read_timeline_history(conn):
        return CheckItem("timeline history", OK, "readable")
    return CheckItem("timeline history", WARN, "not readable: a run after a failover is refused (exit 4)",
                     HISTORY_GRANT)


@click.command()
@click.option("--plugin", type=click.Choice(["test_decoding", "pgoutput"]), default=None,
              help="Also check that this output plugin is available.")
@click.option("--publication", default=None, help="Also check that this publication exists.")
@click.option("--slot", default=None, help="The slot to check: on PostgreSQL 17+ whether it is a failover slot; "
              "on a hot standby whether it is the standby's own slot; with --output, against that output.")
@click.option("--output", default=None, metavar="PATH",
              help="Also check the slot against this output as ingest does before it reads: a gap (the slot past the "
                   "output's high-water mark), another server or a diverged timeline fail (exit 4).")
@click.option("--decode-parallelism", type=click.IntRange(min=1), default=DECODE_PARALLELISM, envvar=PARALLELISM_ENV,
              show_default=True, show_envvar=True,
              help="Say how many temporary copies of the slot an ingest run with this --decode-parallelism makes.")
@json_option
@dsn_option
def check(plugin: str | None, publication: str | None, slot: str | None, output: str | None, decode_parallelism: int,
          as_json: bool, dsn: str | None) -> None:
    """Check that the server is ready for pgpoll; exit 4 with the fix when it is not."""
    if output is not None and slot is None:
        raise ConfigError("--output needs --slot", "pass --slot NAME, the slot that feeds the output")
    tgt = target(dsn)
    conn = connect(tgt)
    try:
        items = run_checks(conn, plugin=plugin, publication=publication)
        items += failover_checks(conn, slot)  # PostgreSQL 17+: the slot, synchronized_standby_slots; a standby's sync
        items += standby_capture_checks(conn, slot)  # a hot standby (16+): decoding there, the slot its own
        items.append(_timeline_history(conn))  # the gap check after a failover reads it (pgpoll.source.slot_gap)
        asked = click.get_current_context().get_parameter_source("decode_parallelism") != ParameterSource.DEFAULT
        items.append(copy_check(conn, slot, decode_parallelism, asked=asked))  # ingest's copies (pgpoll.ingest.decode_ranges)
    finally:
        conn.close()
    if output is not None and slot is not None:
        items.append(_slot_against_output(tgt, slot, output))
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
