"""`pgpoll check --publication`: a publication that would break the source's UPDATE/DELETE fails the check (exit 4)."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.preflight import FAIL, run_checks


def _identity_items(db: Any, publication: str) -> list[Any]:
    conn = connect(ConnectionTarget(db.dsn, "test"))
    try:
        return [i for i in run_checks(conn, publication=publication)
                if i.name.startswith(("row filter of", "column list of", "replica identity of"))]
    finally:
        conn.close()


def test_a_filter_on_a_non_key_column_of_an_updated_table_fails_the_check(db: Any) -> None:
    db.execute('CREATE TABLE "Odd t" (id int PRIMARY KEY, "v al" int, w int)')
    db.execute('CREATE PUBLICATION p FOR TABLE "Odd t" WHERE ("v al" > 5 AND id > 1)')
    items = _identity_items(db, "p")
    assert len(items) == 1 and items[0].status == FAIL
    assert items[0].name == "row filter of public.Odd t"
    # id is the key: not named
    assert items[0].value == ("the row filter uses v al, outside the replica identity (REPLICA IDENTITY DEFAULT: id): "
                              "UPDATE and DELETE fail")
    assert items[0].fix == ('filter on replica identity columns only, or ALTER TABLE public."Odd t" REPLICA IDENTITY FULL, '
                            "or ALTER PUBLICATION p SET (publish = 'insert, truncate')")
    result = CliRunner().invoke(cli, ["check", "--publication", "p"], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 4, result.output
    assert "outside the replica identity" in result.stdout
    assert "error: 1 check(s) failed, first: row filter of public.Odd t is the row filter uses v al" in result.stderr
    # and PostgreSQL indeed refuses the update the check predicts
    db.execute('INSERT INTO "Odd t" VALUES (2, 6, 0)')
    try:
        db.execute('UPDATE "Odd t" SET w = 1')
        raise AssertionError("the UPDATE was expected to fail")
    except Exception as exc:  # psycopg2 error from the server
        assert "not part of the replica identity" in str(exc)


def test_key_columns_full_identity_or_insert_only_publications_are_fine(db: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v int)")
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v int)")
    db.execute("ALTER TABLE b REPLICA IDENTITY FULL")
    db.execute("CREATE TABLE c (id int PRIMARY KEY, v int)")
    db.execute("CREATE TABLE nokey (v int)")
    db.execute("CREATE PUBLICATION keyed FOR TABLE a WHERE (id > 5), TABLE b WHERE (v > 5)")
    db.execute("CREATE PUBLICATION inserts FOR TABLE c WHERE (v > 5), TABLE nokey WITH (publish = 'insert, truncate')")
    assert _identity_items(db, "keyed") == []
    assert _identity_items(db, "inserts") == []
    result = CliRunner().invoke(cli, ["check", "--publication", "keyed"], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0, result.output


def test_every_kind_of_problem_is_one_failed_check(db: Any) -> None:
    db.execute("CREATE TABLE nokey (v int)")
    db.execute("CREATE TABLE nothing (id int PRIMARY KEY, v int)")
    db.execute("ALTER TABLE nothing REPLICA IDENTITY NOTHING")
    db.execute("CREATE TABLE listed (id int PRIMARY KEY, v int, w int)")
    db.execute("CREATE TABLE fulllist (id int PRIMARY KEY, v int)")
    db.execute("ALTER TABLE fulllist REPLICA IDENTITY FULL")
    db.execute("CREATE PUBLICATION p FOR TABLE nokey, nothing, listed (v, w), fulllist (id, v) WITH (publish = 'delete')")
    items = {i.name: i for i in _identity_items(db, "p")}
    assert set(items) == {"replica identity of public.nokey", "replica identity of public.nothing",
                          "column list of public.listed", "column list of public.fulllist"}
    assert all(i.status == FAIL for i in items.values())
    assert items["replica identity of public.nokey"].value == (
        "it has no primary key (REPLICA IDENTITY DEFAULT): DELETE fail")
    assert items["replica identity of public.nokey"].fix.startswith("add a primary key to public.nokey, or ALTER TABLE")
    assert items["replica identity of public.nothing"].value.startswith("its REPLICA IDENTITY is NOTHING")
    assert items["column list of public.listed"].value.startswith(
        "the column list (v, w) does not cover the replica identity (id)")
    assert items["column list of public.listed"].fix.startswith("add id to the column list, or ALTER PUBLICATION")
    assert items["column list of public.fulllist"].value.startswith("it is REPLICA IDENTITY FULL, which no column list covers")
    result = CliRunner().invoke(cli, ["check", "--json", "--publication", "p"], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 4
    assert "error: 4 check(s) failed" in result.stderr
