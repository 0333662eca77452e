"""``pgpoll slot``: create, drop, list, peek and advance replication slots."""

from __future__ import annotations

import click

from pgpoll.cli.options import dsn_option, json_option, target
from pgpoll.cli.output import echo_json, echo_table
from pgpoll.cli.progress import Progress
from pgpoll.errors import ConfigError, PublicationNotFoundError
from pgpoll.lsn import Lsn
from pgpoll.source import slots as slot_access
from pgpoll.source.connection import connect
from pgpoll.source.names import check_identifier, check_slot_name
from pgpoll.source.publications import publication_exists
from pgpoll.source.server_state import in_recovery
from pgpoll.source.waits import CallWatch, standby_creation_note


def _slot_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_slot_name(value)


@click.group()
def slot() -> None:
    """Create, drop, list, peek and advance logical replication slots."""


@slot.command("create")
@click.argument("name", callback=_slot_name)
@click.option("--plugin", type=click.Choice(slot_access.PLUGINS), required=True, help="Output plugin of the slot.")
@click.option("--two-phase", is_flag=True, help="Decode prepared transactions at PREPARE time.")
@click.option("--failover", is_flag=True,
              help="A failover slot (PostgreSQL 17+): standbys with sync_replication_slots keep a copy that survives "
                   "a promotion. See the how-to 'Survive a failover'.")
@dsn_option
def create(name: str, plugin: str, two_phase: bool, failover: bool, dsn: str | None) -> None:
    """Create logical replication slot NAME.

    The creation waits for the transactions running when it starts to end; a
    wait longer than a few seconds is reported on stderr with the session it
    waits for. On a hot standby (PostgreSQL 16+) it also waits for the primary
    to log a running-transactions record (SELECT pg_log_standby_snapshot() on
    the primary): see the how-to 'Capture from a standby'.
    """
    tgt = target(dsn)
    conn = connect(tgt)
    try:
        note = standby_creation_note() if in_recovery(conn) else None
        watch = CallWatch(tgt, f'the creation of slot "{name}"', _say, busy_note=note)
        info = slot_access.create_slot(conn, name, plugin, two_phase=two_phase, failover=failover, watch=watch)
    finally:
        conn.close()
    kind = "failover slot" if info.failover else "slot"
    click.echo(f"created {kind} {info.name} (plugin {info.plugin}) at {info.confirmed_flush_lsn}")


@slot.command("drop")
@click.argument("name", callback=_slot_name)
@click.option("--if-exists", is_flag=True, help="Succeed when the slot does not exist.")
@dsn_option
def drop(name: str, if_exists: bool, dsn: str | None) -> None:
    """Drop replication slot NAME (its unread changes are lost)."""
    conn = connect(target(dsn))
    try:
        dropped = slot_access.drop_slot(conn, name, if_exists=if_exists)
    finally:
        conn.close()
    click.echo(f"dropped slot {name}" if dropped else f"slot {name} does not exist; nothing to do")


@slot.command("list")
@json_option
@dsn_option
def list_(as_json: bool, dsn: str | None) -> None:
    """List replication slots with their position, lag and WAL status."""
    conn = connect(target(dsn))
    try:
        infos = slot_access.list_slots(conn)
    finally:
        conn.close()
    if as_json:
        for info in infos:
            echo_json(info.as_json())
        return
    # failover, synced and sync_ready from PostgreSQL 17; invalidated: invalidation_reason (17+) or conflicting (16)
    failover_columns = any(i.failover is not None for i in infos)
    echo_table(
        ["slot", "plugin", "database", "active", "restart_lsn", "confirmed_lsn", "wal_status", "lag_bytes", "safe_wal_size",
         *(["failover", "synced", "sync_ready"] if failover_columns else []), "invalidated"],
        [
            [i.name, i.plugin, i.database, "yes" if i.active else "no", i.restart_lsn, i.confirmed_flush_lsn,
             i.wal_status, i.lag_bytes, i.safe_wal_size_shown,
             *([_yes_no(i.failover), _yes_no(i.synced), _yes_no(i.sync_ready)] if failover_columns else []),
             i.invalidation_reason or ("conflicting" if i.conflicting else "")]
            for i in infos
        ],
    )


def _say(text: str) -> None:
    """A waiting server call's report (pgpoll.source.waits): stderr, never stdout (rows and JSON)."""
    click.echo(text, err=True)


def _yes_no(value: bool | None) -> str:
    return "" if value is None else "yes" if value else "no"



@slot.command("peek")
@click.argument("name", callback=_slot_name)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Stop after about N rows (upto_nchanges).")
@click.option("--publication", "publications", multiple=True, help="Publication to decode (pgoutput; repeatable).")
@json_option
@dsn_option
def peek(name: str, limit: int | None, publications: tuple[str, ...], as_json: bool, dsn: str | None) -> None:
    """Show what slot NAME holds, without consuming anything."""
    tgt = target(dsn)
    conn = connect(tgt)
    try:
        info = slot_access.check_usable(slot_access.get_slot(conn, name))
        plugin = slot_access.check_plugin(info, "auto")
        for pub in publications:
            check_identifier(pub, "publication name")
            if not publication_exists(conn, pub):
                raise PublicationNotFoundError(
                    f'publication "{pub}" does not exist', "create it: pgpoll publication create NAME --table schema.tbl"
                )
        if plugin == "pgoutput" and not publications:
            raise ConfigError("slot uses pgoutput, which needs a publication", "pass --publication NAME")
        options = slot_access.peek_options(plugin, publications=list(publications))
        watch = CallWatch(tgt, f'the peek of slot "{name}"', _say)
        rows = slot_access.peek_rows(conn, name, plugin, upto_nchanges=limit, options=options, raw_text=True,
                                     watch=watch)
        progress = Progress()  # a terminal only: a large backlog takes the server a while
        for count, (lsn, xid, raw) in enumerate(rows):
            if limit is not None and count >= limit:
                break
            progress.update(f"{count:,} row(s) peeked, at {lsn}")
            data = bytes(raw)  # peek_rows gives a memoryview (pgoutput) or bytes (raw_text)
            text = _as_text(data) if plugin not in slot_access.BINARY_PLUGINS else None
            if as_json:
                row: dict[str, object] = {"lsn": str(lsn), "xid": xid}
                if text is None:
                    row["data_hex"] = data.hex()  # binary plugin output, or text that is not UTF-8
                else:
                    row["data"] = text
                echo_json(row)
            elif text is None:
                click.echo(f"{lsn}\t{xid}\t{chr(data[0]) if data else ''} {data.hex()}")
            else:
                click.echo(f"{lsn}\t{xid}\t{text}")
        progress.done()
    finally:
        conn.close()


def _as_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@slot.command("advance")
@click.argument("name", callback=_slot_name)
@click.argument("lsn")
@dsn_option
def advance(name: str, lsn: str, dsn: str | None) -> None:
    """Advance slot NAME to LSN (a no-op when it is already there or past it)."""
    position = Lsn.parse(lsn)
    tgt = target(dsn)
    conn = connect(tgt)
    try:
        result = slot_access.advance_slot(conn, name, position, watch=CallWatch(tgt, f'the advance of slot "{name}"', _say))
    finally:
        conn.close()
    if result.moved:
        click.echo(f"advanced slot {name} from {result.before} to {result.after}")
    else:
        click.echo(f"slot {name} is already at {result.before}; nothing to do")
