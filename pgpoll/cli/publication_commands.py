"""``pgpoll publication``: create, drop and show publications."""

from __future__ import annotations

import click

from pgpoll.cli.options import dsn_option, json_option, target
from pgpoll.cli.output import echo_json, echo_table
from pgpoll.source import publications as pubs
from pgpoll.source.connection import connect
from pgpoll.source.names import check_identifier


@click.group()
def publication() -> None:
    """Create, drop and show publications (what pgoutput sends)."""


@publication.command("create")
@click.argument("name")
@click.option("--all-tables", is_flag=True, help="Publish every table of the database.")
@click.option("--table", "tables", multiple=True, metavar="'SCHEMA.TBL [(COL, ...)] [WHERE (EXPR)]'",
              help="A table, with an optional column list and row filter (repeatable).")
@click.option("--publish", default=None, metavar="ACTIONS", help="Comma list of insert,update,delete,truncate (default: all).")
@click.option("--via-partition-root", is_flag=True, help="Publish partition changes as changes of the root table.")
@click.option("--replica-identity-full", is_flag=True,
              help="Changes the source tables: ALTER TABLE ... REPLICA IDENTITY FULL on each published table that "
                   "has no usable replica identity or whose row filter needs it (their UPDATE/DELETE then log the "
                   "whole old row).")
@dsn_option
def create(name: str, all_tables: bool, tables: tuple[str, ...], publish: str | None, via_partition_root: bool,
           replica_identity_full: bool, dsn: str | None) -> None:
    """Create publication NAME.

    Refused (exit 2, nothing created) when it would make the source's own UPDATE or
    DELETE fail: a table without a usable replica identity, a column list that does
    not cover it, or a row filter on columns outside it. The error names the fix.
    """
    check_identifier(name, "publication name")
    specs = [pubs.parse_table_spec(t) for t in tables]
    actions = [a.strip() for a in publish.split(",")] if publish is not None else None
    conn = connect(target(dsn))
    try:
        created = pubs.create_publication(conn, name, all_tables=all_tables, tables=specs, publish=actions,
                                          via_partition_root=via_partition_root,
                                          replica_identity_full=replica_identity_full)
    finally:
        conn.close()
    click.echo(f"created publication {name}")
    for table in created.identity_full:
        click.echo(f"set REPLICA IDENTITY FULL on {table}")
    if all_tables:
        changes = actions is None or bool({"update", "delete"} & set(actions))
        click.echo(f"warning: publication {name} is FOR ALL TABLES: tables created later are published too"
                   + ("; each needs a primary key (or REPLICA IDENTITY FULL) or its UPDATE and DELETE will fail"
                      " on the source" if changes else ""), err=True)


@publication.command("drop")
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="Succeed when the publication does not exist.")
@dsn_option
def drop(name: str, if_exists: bool, dsn: str | None) -> None:
    """Drop publication NAME."""
    conn = connect(target(dsn))
    try:
        dropped = pubs.drop_publication(conn, name, if_exists=if_exists)
    finally:
        conn.close()
    click.echo(f"dropped publication {name}" if dropped else f"publication {name} does not exist; nothing to do")


@publication.command("show")
@click.argument("name")
@json_option
@dsn_option
def show(name: str, as_json: bool, dsn: str | None) -> None:
    """Show publication NAME: actions, tables, column lists and row filters."""
    conn = connect(target(dsn))
    try:
        info = pubs.show_publication(conn, name)
    finally:
        conn.close()
    if as_json:
        echo_json(info.as_json())
        return
    click.echo(f"publication {info.name}: publishes {', '.join(info.publish) or 'nothing'}"
               + ("; all tables" if info.all_tables else "")
               + ("; via partition root" if info.via_partition_root else ""))
    echo_table(["schema", "table", "columns", "row filter"],
               [[t.schema, t.table, ", ".join(t.columns) if t.columns else "(all)", t.row_filter or ""] for t in info.tables])
