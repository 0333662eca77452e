"""``pgpoll status``: lag in bytes and in time, WAL status and the output's position, for people and monitors.

``--format prometheus`` prints the same numbers as Prometheus gauges
(:mod:`pgpoll.observe.status_metrics`). Exit codes: 0 all well; 4 when a slot is lost (``wal_status = lost``) or,
with ``--output``, when ``ingest`` would refuse the slot against the output
(``slot_ahead_of_output``, ``other_server``, ``timeline_diverged``, ``timeline_unverified``); 7 when a
slot's lag is above ``--max-lag-bytes``. 4 takes precedence over 7: a source
problem is named before a lag. The report is printed first in every case,
so a monitor gets the numbers with the verdict.
"""

from __future__ import annotations

from typing import Any

import click

from pgpoll.cli import exitcodes
from pgpoll.cli.options import dsn_option, json_option, target
from pgpoll.cli.output import echo_json, echo_table
from pgpoll.errors import SlotInvalidatedError
from pgpoll.source.names import check_slot_name
from pgpoll.source.slots import SlotInfo
from pgpoll.status import StatusReport, collect_status


def _slot_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return check_slot_name(value) if value is not None else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"



def _print_table(report: StatusReport, with_output: bool) -> None:
    if not report.slots:
        click.echo(f"no logical replication slots in database {report.database}")
        return
    headers = ["slot", "plugin", "active_pid", "wal_status", "safe_wal_size", "confirmed_lsn", "lag_bytes", "lag_time"]
    if with_output:
        headers += ["high_water_mark", "position"]
    failover = any(s.info.failover is not None for s in report.slots)  # PostgreSQL 17+
    if failover:
        headers.append("failover")
    headers.append("alerts")
    rows = []
    for s in report.slots:
        row: list[Any] = [s.info.name, s.info.plugin, s.info.active_pid, s.info.wal_status, s.info.safe_wal_size_shown,
                          s.info.confirmed_flush_lsn, s.info.lag_bytes, _duration(s.lag_seconds)]
        if with_output:
            row += [s.output.high_water_mark if s.output else None, s.position]
        if failover:
            row.append(_failover_cell(s.info))
        row.append(",".join(s.alerts))
        rows.append(row)
    echo_table(headers, rows)


def _failover_cell(info: SlotInfo) -> str:
    """``yes``/``no``, and on a standby whether its synced copy is usable after a promotion (``sync-ready``)."""
    if not info.failover:
        return "no"
    if info.synced:
        return "synced, sync-ready" if info.sync_ready else "synced, not sync-ready"
    return "yes"


@click.command("status")
@click.option("--output", default=None, metavar="PATH",
              help="Output path of the ingest job: compare its commit log with the slot that feeds it (read without Spark).")
@click.option("--slot", default=None, callback=_slot_name,
              help="Report only this slot (default: every logical slot of the database).")
@click.option("--max-lag-bytes", type=click.IntRange(min=0), default=None, metavar="N",
              help=f"Exit {exitcodes.STATUS_ALERT} when a slot's lag in bytes is above N.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table", show_default=True,
              help="table: for people; json: one object per slot (as --json); prometheus: the slot and output gauges "
                   "in Prometheus's text format, for node_exporter's textfile collector.")
@json_option
@dsn_option
def command(output: str | None, slot: str | None, max_lag_bytes: int | None, fmt: str, as_json: bool,
            dsn: str | None) -> None:
    """Show each slot's lag (bytes and time), WAL status, safe WAL size, active PID and, with --output,
    its position against the output.

    Exits 4 when a slot is lost or, with --output, when ingest would refuse it
    (a gap between the slot and the output, another server or timeline), and 7
    when a lag is above --max-lag-bytes (4 takes precedence), after printing the
    report. Nothing is consumed, locked or started.
    """
    if as_json and fmt not in ("table", "json"):
        raise click.UsageError(f"--json and --format {fmt} say different things: give one")
    fmt = "json" if as_json else fmt
    report = collect_status(target(dsn), slot=slot, output=output, max_lag_bytes=max_lag_bytes)
    if fmt == "json":
        for status in report.slots:
            echo_json(status.as_json())
    elif fmt == "prometheus":  # prometheus_client is imported only here: every other command starts without it
        from pgpoll.observe.status_metrics import status_text

        click.echo(status_text(report), nl=False)
    else:
        _print_table(report, output is not None)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    if report.lost:
        names = ", ".join(s.info.name for s in report.lost)
        raise SlotInvalidatedError(
            f"slot(s) {names} lost the WAL they need (wal_status = lost)",
            "recreate the slot (pgpoll slot drop, then pgpoll slot create), then run `pgpoll resync` on the same "
            "output (see docs/how-to/lost-slot.md)",
        )
    for gap in report.gaps:
        assert gap.verdict is not None and gap.verdict.error is not None
        if len(report.gaps) == 1:
            raise gap.verdict.error
        click.echo(f"alert: {gap.verdict.error}", err=True)
    if report.gaps:
        raise SystemExit(exitcodes.SOURCE)
    if report.lagging:
        for s in report.lagging:
            click.echo(
                f"alert: slot {s.info.name} is {s.info.lag_bytes} bytes behind, above --max-lag-bytes {max_lag_bytes}",
                err=True,
            )
        click.echo("  fix: run the ingest job now, then more often or with a larger --max-changes / --max-seconds", err=True)
        raise SystemExit(exitcodes.STATUS_ALERT)
