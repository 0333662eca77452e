"""``pgpoll retain``: remove change-log batches older than a retention, never what a destination or a rebuild needs.

No default age: ``--retention`` (or ``PGPOLL_RETENTION``) says how long batches
stay; without it (``off``) nothing is removed, because the change log is the
only copy of changes the slot no longer holds.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import click

from pgpoll.cli.output import echo_json
from pgpoll.housekeeping.retention import run_retain
from pgpoll.materialize.maintenance import parse_retention
from pgpoll.sink import destinations
from pgpoll.sink.stores.filesystem import check_readable, open_output


def _human(out: dict[str, Any]) -> None:
    if out.get("deferred"):
        click.echo(f"the floor is at commit-log record {out['floor']}; the batches below it are removed by a later "
                   f"pgpoll retain, once the materialize run(s) of {', '.join(out['deferred'])} that started before "
                   "it have ended")
        return
    verb = "would remove" if out["dry_run"] else "removed"
    click.echo(f"{verb} {out['batches']} batch(es), {out['rows']} row(s), {out['bytes']} byte(s): commit-log records "
               f"{out['floor_before'] + 1}..{out['floor']}" if out["floor"] > out["floor_before"]
               else f"{verb} no batch (the floor stays at commit-log record {out['floor']})")
    if out["dry_run"]:
        for partition in out["partitions"]:
            click.echo(f"  changes/{partition}")
    for sid in out["snapshots"]:
        click.echo(f"{verb} superseded snapshot {sid}")
    for hold in out["held_by"]:
        click.echo(f"held by: {hold}")
    for dest in out.get("destinations", ()):
        click.echo(f"destination {dest['dest']} ({dest['format']}): at {dest['position']}"
                   + (" (a run has not ended)" if dest["building"] else ""))


@click.command("retain")
@click.option("--output", required=True, help="The output path pgpoll ingest writes.")
@click.option("--retention", default="off", show_default=True, metavar="AGE", envvar="PGPOLL_RETENTION",
              show_envvar=True,
              help="Remove batches committed longer ago than AGE (7d, 168h, 90m), never one a registered destination "
                   "has not applied or a table's newest complete snapshot needs; superseded snapshots go too. "
                   "off: remove nothing.")
@click.option("--dry-run", is_flag=True, default=False, help="List what would be removed (and what holds the rest) "
              "without removing anything.")
@click.option("--unregister", "unregister", multiple=True, metavar="DEST",
              help="Forget a registered state destination (one that is gone: it no longer holds retention back), "
                   "then stop.")
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON line: what was (or would be) removed.")
def command(output: str, retention: str, dry_run: bool, unregister: tuple[str, ...], as_json: bool) -> None:
    """Remove change-log batches (and superseded snapshots) older than --retention from OUTPUT.

    A merge of pgpoll compact goes whole or not at all (retention stops before one it would cut). Never runs
    beside pgpoll compact: exit 3 while a compaction holds the output.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        hours = parse_retention(retention)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--retention") from None
    fs = open_output(output)
    check_readable(fs)
    if unregister:
        for dest in unregister:
            gone = destinations.unregister(fs, dest)
            if not gone:
                raise click.BadParameter(f"{dest} is not a registered destination of {output} (see pgpoll retain "
                                         "--dry-run)", param_hint="--unregister")
            for d in gone:
                click.echo(f"unregistered {d.name}")
        return
    if hours is None:
        off = {"dry_run": False, "retention": "off", "batches": 0, "floor": None, "note":
               "--retention is off: nothing removed (set --retention or PGPOLL_RETENTION, e.g. 7d)"}
        if as_json:
            echo_json(off)
        else:
            click.echo(off["note"])
        return
    out: dict[str, Any] = run_retain(output, timedelta(hours=hours), dry_run=dry_run, fs=fs)
    out["destinations"] = [{"dest": d.dest, "format": d.format, "catalog": d.catalog,
                            "position": str(d.position()) if d.position() is not None else None,
                            "building": d.building is not None, "updated_at": d.updated_at}
                           for d in destinations.registered(fs)]
    out["retention"] = retention
    if as_json:
        echo_json(out)
    else:
        _human(out)
    for warning in out["warnings"]:
        click.echo(f"warning: {warning}", err=True)
