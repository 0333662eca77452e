"""``pgpoll publication``: create, show and drop with hostile names, column lists and row filters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg2 import sql

from pgpoll.source.names import quote_ident

# (schema, table, columns, publication): each a name PostgreSQL accepts only quoted.
HOSTILE = [
    pytest.param('My "Sch".; --x', 'Tä b;le--".', ['Col "A", b', "ünï", "id"], 'Pub "1"; --x', id="quotes-dots-semicolons"),
    pytest.param("MixedCase", "CamelTable", ["ID", "Value Two"], "MixedPub", id="mixed-case"),
    pytest.param("sch ema", "ta ble", ["a b", "c.d"], "pub lication", id="spaces-dots"),
    pytest.param("ユニ", "表", ["列", "ß"], "出版", id="unicode"),
    pytest.param("s", "drop table x; --", ["x; drop table y", "/*c*/"], "p'; drop --", id="sql-text"),
]


def pubs(db: Any) -> list[str]:
    return [r[0] for r in db.execute("SELECT pubname FROM pg_publication ORDER BY 1")]


def make_table(db: Any, schema: str, table: str, columns: list[str]) -> None:
    """A table of int columns whose primary key is its first two (what the tests' column lists and filters use)."""
    db.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    cols = sql.SQL(", ").join(sql.SQL("{} int").format(sql.Identifier(c)) for c in columns)
    key = sql.SQL(", ").join(sql.Identifier(c) for c in columns[:2])
    db.execute(sql.SQL("CREATE TABLE {}.{} ({}, PRIMARY KEY ({}))").format(
        sql.Identifier(schema), sql.Identifier(table), cols, key))


@pytest.mark.parametrize(("schema", "table", "columns", "publication"), HOSTILE)
def test_create_and_show_round_trip_hostile_names_exactly(
    db: Any, pgpoll: Any, schema: str, table: str, columns: list[str], publication: str
) -> None:
    make_table(db, schema, table, columns)
    spec = f"{quote_ident(schema)}.{quote_ident(table)} ({', '.join(quote_ident(c) for c in columns[:2])})"
    spec += f" WHERE ({quote_ident(columns[0])} > 1 AND {quote_ident(columns[1])} IS NOT NULL)"
    result = pgpoll("publication", "create", publication, "--table", spec, "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"created publication {publication}"
    assert pubs(db) == [publication]

    shown = pgpoll("publication", "show", publication, "--json", "--dsn", db.dsn)
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert info["publication"] == publication
    assert len(info["tables"]) == 1
    published = info["tables"][0]
    assert (published["schema"], published["table"]) == (schema, table)
    assert published["columns"] == columns[:2]
    assert published["row_filter"] is not None and quote_ident(columns[0]) in published["row_filter"]

    text = pgpoll("publication", "show", publication, "--dsn", db.dsn)
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0] == f"publication {publication}: publishes insert, update, delete, truncate"
    assert schema in text.stdout and table in text.stdout and columns[0] in text.stdout


def test_unquoted_names_fold_ascii_only_like_postgresql(db: Any, pgpoll: Any) -> None:
    # Unquoted ÄBC is the table "Äbc" for PostgreSQL (UTF-8 folds ASCII letters only).
    db.execute('CREATE TABLE "Äbc" (id int PRIMARY KEY, "Üx" int)')
    result = pgpoll("publication", "create", "fold_pub", "--table", "PUBLIC.ÄBC (ID)", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    info = json.loads(pgpoll("publication", "show", "fold_pub", "--json", "--dsn", db.dsn).stdout)
    assert [(t["schema"], t["table"], t["columns"]) for t in info["tables"]] == [("public", "Äbc", ["id"])]


def test_show_reports_no_column_list_when_none_was_given(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
    assert pgpoll("publication", "create", "p", "--table", "a", "--table", "b (id, v)", "--dsn", db.dsn).exit_code == 0
    info = json.loads(pgpoll("publication", "show", "p", "--json", "--dsn", db.dsn).stdout)
    assert [(t["table"], t["columns"], t["row_filter"]) for t in info["tables"]] == [("a", None, None), ("b", ["id", "v"], None)]
    text = pgpoll("publication", "show", "p", "--dsn", db.dsn).stdout.splitlines()
    assert text[1].split() == ["schema", "table", "columns", "row", "filter"]
    assert text[2].split() == ["public", "a", "(all)"]
    assert text[3].split() == ["public", "b", "id,", "v"]


def test_create_with_publish_actions_and_via_partition_root(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE parted (id int, day date, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)")
    db.execute("CREATE TABLE parted_2024 PARTITION OF parted FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    result = pgpoll("publication", "create", "p", "--table", "parted", "--publish", "insert, delete",
                    "--via-partition-root", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    info = json.loads(pgpoll("publication", "show", "p", "--json", "--dsn", db.dsn).stdout)
    assert info["publish"] == ["insert", "delete"]
    assert info["via_partition_root"] is True
    assert [t["table"] for t in info["tables"]] == ["parted"]
    text = pgpoll("publication", "show", "p", "--dsn", db.dsn).stdout
    assert text.splitlines()[0] == "publication p: publishes insert, delete; via partition root"


def test_create_all_tables(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)")
    created = pgpoll("publication", "create", "everything", "--all-tables", "--dsn", db.dsn)
    assert created.exit_code == 0
    assert created.stderr == ("warning: publication everything is FOR ALL TABLES: tables created later are published too; "
                              "each needs a primary key (or REPLICA IDENTITY FULL) or its UPDATE and DELETE will fail "
                              "on the source\n")
    info = json.loads(pgpoll("publication", "show", "everything", "--json", "--dsn", db.dsn).stdout)
    assert info["all_tables"] is True
    assert [(t["schema"], t["table"], t["columns"]) for t in info["tables"]] == [("public", "a", None)]
    inserts = pgpoll("publication", "create", "inserts", "--all-tables", "--publish", "insert", "--dsn", db.dsn)
    assert inserts.exit_code == 0
    assert inserts.stderr == "warning: publication inserts is FOR ALL TABLES: tables created later are published too\n"


REFUSED_FILTERS = [
    ("t WHERE (id > 1); DROP TABLE victim", "unexpected text after the row filter"),
    ("t WHERE (id > 1; DROP TABLE victim)", "contains ';' outside a string literal"),
    ("t WHERE (id > 1) -- comment", "unexpected text after the row filter"),
    ("t WHERE (id > 1 -- comment\n)", "contains '--' outside a string literal"),
    ("t WHERE (id /* c */ > 1)", "contains '/*' outside a string literal"),
    ("t WHERE (v = $$x$$)", "contains '$' outside a string literal"),
    ("t WHERE (v = E'\\'') ; DROP TABLE victim; SELECT (E'\\'')", "contains a backslash"),
    ("t WHERE (v = '\\'); DROP TABLE victim; --')", "contains a backslash"),
    ("t WHERE id > 1", "must be in parentheses"),
    ("t WHERE ((id > 1)", "unbalanced parentheses"),
    ("t WHERE (v = 'open)", "unterminated ' in row filter"),
    ("t (id) trailing", "unexpected 'trailing' in table"),
    ("t; DROP TABLE victim", "unexpected '; DROP TABLE victim' in table"),
    ('"t', "unterminated quoted name"),
    ("t (id", "unclosed column list"),
    ("(id) t", "expected a name at position 0"),
]


@pytest.mark.parametrize(("spec", "message"), REFUSED_FILTERS, ids=[f"case{i}" for i in range(len(REFUSED_FILTERS))])
def test_unsafe_or_malformed_table_spec_exits_2_and_creates_nothing(db: Any, pgpoll: Any, spec: str, message: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE victim (x int)")
    result = pgpoll("publication", "create", "p", "--table", spec, "--dsn", db.dsn)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert pubs(db) == []
    assert db.execute("SELECT to_regclass('victim') IS NOT NULL")[0][0]


def test_row_filter_keeps_semicolons_and_dashes_inside_string_literals(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    spec = """t WHERE (v <> ';--/*$' AND v <> 'it''s' AND "v" IS NOT NULL)"""
    # insert only: a filter on the non-key v with UPDATE/DELETE published would be refused
    result = pgpoll("publication", "create", "p", "--table", spec, "--publish", "insert", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    info = json.loads(pgpoll("publication", "show", "p", "--json", "--dsn", db.dsn).stdout)
    assert "';--/*$'::text" in info["tables"][0]["row_filter"]
    assert "'it''s'::text" in info["tables"][0]["row_filter"]


def test_row_filter_postgresql_refuses_exits_2(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    result = pgpoll("publication", "create", "p", "--table", "t WHERE (random() > 0.5)", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "PostgreSQL refused the publication: invalid publication WHERE expression" in result.stderr
    assert "mutable functions are not allowed" in result.stderr
    syntax = pgpoll("publication", "create", "p", "--table", "t WHERE (id >)", "--dsn", db.dsn)
    assert syntax.exit_code == 2
    assert 'syntax error at or near ")"' in syntax.stderr
    assert pubs(db) == []


def test_create_missing_table_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("publication", "create", "p", "--table", "Missing", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'relation "public.missing" does not exist' in result.stderr
    assert "unquoted names fold to lower case" in result.stderr


def test_create_missing_column_exits_4(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    result = pgpoll("publication", "create", "p", "--table", "t (id, nope)", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'column "nope" of relation "t" does not exist' in result.stderr


def test_create_duplicate_exits_4(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    assert pgpoll("publication", "create", "p", "--table", "t", "--dsn", db.dsn).exit_code == 0
    result = pgpoll("publication", "create", "p", "--table", "t", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'publication "p" already exists' in result.stderr


def test_create_needs_exactly_one_of_all_tables_and_table(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for args in ([], ["--all-tables", "--table", "t"]):
        result = pgpoll("publication", "create", "p", *args, "--dsn", db.dsn)
        assert result.exit_code == 2
        assert "give either --all-tables or one or more --table" in result.stderr
    bad = pgpoll("publication", "create", "p", "--table", "t", "--publish", "insert,upsert", "--dsn", db.dsn)
    assert bad.exit_code == 2
    assert "unknown --publish action(s) ['upsert']" in bad.stderr
    assert pubs(db) == []


def test_create_too_long_publication_name_exits_2(db: Any, pgpoll: Any) -> None:
    result = pgpoll("publication", "create", "p" * 64, "--all-tables", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "is longer than 63 bytes" in result.stderr


@pytest.mark.parametrize("grant_create", [False, True], ids=["no-create-on-db", "not-owner"])
def test_create_without_privileges_exits_4_saying_who_creates_publications(
    db: Any, pgpoll: Any, make_role: Any, grant_create: bool
) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    role = make_role("REPLICATION")
    db.execute(sql.SQL("GRANT SELECT ON t TO {}").format(sql.Identifier(role.name)))
    if grant_create:
        db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(db.name), sql.Identifier(role.name)))
    result = pgpoll("publication", "create", "p", "--table", "t", "--dsn", role.dsn)
    assert result.exit_code == 4
    expected = "must be owner of table t" if grant_create else f"permission denied for database {db.name}"
    assert f"error: cannot create publication p: {expected}" in result.stderr
    assert "publications are created by the tables' owner holding CREATE on the database" in result.stderr
    assert pubs(db) == []
    db.execute("CREATE PUBLICATION theirs FOR TABLE t")
    dropped = pgpoll("publication", "drop", "theirs", "--dsn", role.dsn)
    assert dropped.exit_code == 4
    assert "must be owner of publication theirs" in dropped.stderr
    assert pubs(db) == ["theirs"]


def test_drop_removes_publication(db: Any, pgpoll: Any) -> None:
    db.execute('CREATE PUBLICATION "Odd ""pub""" FOR ALL TABLES')
    result = pgpoll("publication", "drop", 'Odd "pub"', "--dsn", db.dsn)
    assert result.exit_code == 0
    assert result.stdout.strip() == 'dropped publication Odd "pub"'
    assert pubs(db) == []


def test_drop_missing_exits_4_and_if_exists_exits_0(db: Any, pgpoll: Any) -> None:
    result = pgpoll("publication", "drop", "nope", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'publication "nope" does not exist' in result.stderr
    ok = pgpoll("publication", "drop", "nope", "--if-exists", "--dsn", db.dsn)
    assert ok.exit_code == 0
    assert ok.stdout.strip() == "publication nope does not exist; nothing to do"


def test_show_missing_exits_4(db: Any, pgpoll: Any) -> None:
    result = pgpoll("publication", "show", "nope", "--dsn", db.dsn)
    assert result.exit_code == 4
    assert 'publication "nope" does not exist' in result.stderr
    assert "fix: create it: pgpoll publication create" in result.stderr


def test_peek_pgoutput_with_hostile_publication_name(db: Any, pgpoll: Any) -> None:
    # pgoutput splits publication_names like identifiers: a comma or quote in a name must survive.
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    name = 'Pub, "2"; x'
    assert pgpoll("publication", "create", name, "--table", "t", "--dsn", db.dsn).exit_code == 0
    slot = db.slot_name()
    pgpoll("slot", "create", slot, "--plugin", "pgoutput", "--dsn", db.dsn)
    db.execute("INSERT INTO t VALUES (7)")
    result = pgpoll("slot", "peek", slot, "--publication", name, "--json", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    kinds = [bytes.fromhex(json.loads(line)["data_hex"])[:1] for line in result.stdout.splitlines()]
    assert kinds == [b"B", b"R", b"I", b"C"]


# ---- never break the source's writes (issue 15, item 5) -------------------------------------


def identity(db: Any, table: str) -> str:
    return str(db.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,))[0][0])


def test_table_without_primary_key_is_refused_naming_the_fixes(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY, v int)")
    db.execute("CREATE TABLE nokey (v int)")
    result = pgpoll("publication", "create", "p", "--table", "keyed", "--table", "nokey", "--dsn", db.dsn)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: publication p not created: public.nokey: it has no primary key (REPLICA IDENTITY DEFAULT); "
        "its UPDATE and DELETE would fail on the source",
        "  fix: add a primary key to public.nokey, or --replica-identity-full (sets REPLICA IDENTITY FULL on the table), "
        "or --publish insert,truncate",
    ]
    assert pubs(db) == []
    db.execute("INSERT INTO nokey VALUES (1)")
    db.execute("UPDATE nokey SET v = 2")  # the source's writes still work

    inserts = pgpoll("publication", "create", "p", "--table", "keyed", "--table", "nokey", "--publish", "insert,truncate",
                     "--dsn", db.dsn)
    assert inserts.exit_code == 0, inserts.output
    assert identity(db, "nokey") == "d"
    db.execute("UPDATE nokey SET v = 3")


def test_replica_identity_full_sets_it_on_the_tables_that_need_it(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE keyed (id int PRIMARY KEY, v int)")
    db.execute('CREATE TABLE "No Key" (v int)')
    db.execute("CREATE TABLE filtered (id int PRIMARY KEY, v int)")
    result = pgpoll("publication", "create", "p", "--table", "keyed", "--table", '"No Key"',
                    "--table", "filtered WHERE (v > 1)", "--replica-identity-full", "--dsn", db.dsn)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["created publication p", "set REPLICA IDENTITY FULL on public.No Key",
                                          "set REPLICA IDENTITY FULL on public.filtered"]
    assert (identity(db, "keyed"), identity(db, '"No Key"'), identity(db, "filtered")) == ("d", "f", "f")
    db.execute('INSERT INTO "No Key" VALUES (1); INSERT INTO filtered VALUES (1, 1)')
    db.execute('UPDATE "No Key" SET v = 2; DELETE FROM filtered')


def test_column_list_must_cover_the_key_and_full_does_not_help(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, w int)")
    result = pgpoll("publication", "create", "p", "--table", "t (v, w)", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert ("error: publication p not created: public.t: the column list (v, w) does not cover the replica identity (id); "
            "its UPDATE and DELETE would fail on the source") in result.stderr
    assert "fix: add id to the column list, or --publish insert,truncate" in result.stderr
    full = pgpoll("publication", "create", "p", "--table", "t (v, w)", "--replica-identity-full", "--dsn", db.dsn)
    assert full.exit_code == 2
    assert pubs(db) == [] and identity(db, "t") == "d"  # rolled back together
    assert pgpoll("publication", "create", "p", "--table", "t (id, v)", "--dsn", db.dsn).exit_code == 0


def test_row_filter_outside_the_key_is_refused(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    result = pgpoll("publication", "create", "p", "--table", "t WHERE (v > 1)", "--publish", "insert,update",
                    "--dsn", db.dsn)
    assert result.exit_code == 2
    assert ("public.t: the row filter uses v, outside the replica identity (REPLICA IDENTITY DEFAULT: id); "
            "its UPDATE would fail on the source") in result.stderr
    assert ("fix: filter on replica identity columns only, or --replica-identity-full (sets REPLICA IDENTITY FULL "
            "on the table), or --publish insert,truncate") in result.stderr
    assert pubs(db) == []


def test_all_tables_is_checked_against_every_existing_table(db: Any, pgpoll: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (v int); CREATE TABLE c (v int)")
    result = pgpoll("publication", "create", "p", "--all-tables", "--dsn", db.dsn)
    assert result.exit_code == 2
    assert "error: publication p not created: public.b: it has no primary key" in result.stderr
    assert "(and 1 more: public.c)" in result.stderr
    assert pubs(db) == []
