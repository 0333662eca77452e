"""`pgpoll check --publication`: row filters that use columns outside the replica identity are flagged."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.preflight import WARN, run_checks


def _filter_items(db: Any, publication: str) -> list[Any]:
    conn = connect(ConnectionTarget(db.dsn, "test"))
    try:
        return [i for i in run_checks(conn, publication=publication) if i.name.startswith("row filter")]
    finally:
        conn.close()


def test_a_filter_on_a_non_key_column_of_an_updated_table_is_warned(db: Any) -> None:
    db.execute('CREATE TABLE "Odd t" (id int PRIMARY KEY, "v al" int, w int)')
    db.execute('CREATE PUBLICATION p FOR TABLE "Odd t" WHERE ("v al" > 5 AND id > 1)')
    items = _filter_items(db, "p")
    assert len(items) == 1 and items[0].status == WARN
    assert items[0].name == "row filter of public.Odd t"
    assert items[0].value == "uses v al, outside the replica identity"  # id is the key: not named
    result = CliRunner().invoke(cli, ["check", "--publication", "p"], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0 and "outside the replica identity" in result.stdout
    # and PostgreSQL indeed refuses the update the warning predicts
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
    db.execute("CREATE PUBLICATION keyed FOR TABLE a WHERE (id > 5), TABLE b WHERE (v > 5)")
    db.execute("CREATE PUBLICATION inserts FOR TABLE c WHERE (v > 5) WITH (publish = 'insert')")
    assert _filter_items(db, "keyed") == []
    assert _filter_items(db, "inserts") == []
