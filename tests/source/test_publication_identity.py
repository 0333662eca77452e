"""Tables whose UPDATE/DELETE a publication would break: pgpoll's finding against the server's own verdict.

Each case builds a table and a publication with plain SQL, asks
:func:`identity_problems` which tables would break, then lets PostgreSQL decide:
an UPDATE (``SET col = col``) on every table of the case must fail exactly on the
tables pgpoll named, with the server's "replica identity" refusal.
"""

from __future__ import annotations

from typing import Any

import psycopg2

from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.publication_identity import COLUMN_LIST, NO_IDENTITY, ROW_FILTER, identity_problems

# (id, setup SQL, publication clause, {table modified: expected problem kind}); every table has a column v.
CASES = [
    ("primary-key", ["CREATE TABLE t (id int PRIMARY KEY, v int)"], "FOR TABLE t", {}),
    ("no-key", ["CREATE TABLE t (id int, v int)"], "FOR TABLE t", {"public.t": NO_IDENTITY}),
    ("nothing", ["CREATE TABLE t (id int PRIMARY KEY, v int)", "ALTER TABLE t REPLICA IDENTITY NOTHING"],
     "FOR TABLE t", {"public.t": NO_IDENTITY}),
    ("index-dropped", ["CREATE TABLE t (id int NOT NULL, v int)", "CREATE UNIQUE INDEX t_id ON t (id)",
                       "ALTER TABLE t REPLICA IDENTITY USING INDEX t_id", "DROP INDEX t_id"],
     "FOR TABLE t", {"public.t": NO_IDENTITY}),
    ("using-index-listed", ["CREATE TABLE t (id int NOT NULL, v int, w int)", "CREATE UNIQUE INDEX t_id ON t (id)",
                            "ALTER TABLE t REPLICA IDENTITY USING INDEX t_id"],
     "FOR TABLE t (id, v)", {}),
    ("list-without-key", ["CREATE TABLE t (id int PRIMARY KEY, v int)"], "FOR TABLE t (v)",
     {"public.t": COLUMN_LIST}),
    ("full-with-complete-list", ["CREATE TABLE t (id int PRIMARY KEY, v int)", "ALTER TABLE t REPLICA IDENTITY FULL"],
     "FOR TABLE t (id, v)", {"public.t": COLUMN_LIST}),
    ("filter-on-key", ["CREATE TABLE t (id int PRIMARY KEY, v int)"], "FOR TABLE t WHERE (id > 0)", {}),
    ("filter-off-key", ["CREATE TABLE t (id int PRIMARY KEY, v int)"], "FOR TABLE t WHERE (v > 0)",
     {"public.t": ROW_FILTER}),
    ("filter-full", ["CREATE TABLE t (id int PRIMARY KEY, v int)", "ALTER TABLE t REPLICA IDENTITY FULL"],
     "FOR TABLE t WHERE (v > 0)", {}),
    ("insert-only", ["CREATE TABLE t (id int, v int)"], "FOR TABLE t WITH (publish = 'insert, truncate')", {}),
    ("all-tables", ["CREATE TABLE t (id int PRIMARY KEY, v int)", "CREATE TABLE u (id int, v int)"], "FOR ALL TABLES",
     {"public.u": NO_IDENTITY}),
    ("partition-root-filter", ["CREATE TABLE t (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)",
                               "CREATE TABLE t_all PARTITION OF t DEFAULT"],
     "FOR TABLE t WHERE (v > 0) WITH (publish_via_partition_root = true)", {"public.t_all": ROW_FILTER}),
    ("partition-leaf-filter", ["CREATE TABLE t (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)",
                               "CREATE TABLE t_all PARTITION OF t DEFAULT"],
     "FOR TABLE t, t_all WHERE (v > 0)", {"public.t_all": ROW_FILTER}),
    ("partition-leaf-key-filter", ["CREATE TABLE t (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)",
                                   "CREATE TABLE t_all PARTITION OF t DEFAULT"],
     "FOR TABLE t, t_all WHERE (id > 0)", {}),
    ("partition-without-key", ["CREATE TABLE t (id int, v int) PARTITION BY RANGE (id)",
                               "CREATE TABLE t_all PARTITION OF t DEFAULT"],
     "FOR TABLE t", {"public.t_all": NO_IDENTITY}),
]


def test_problems_are_exactly_what_the_server_refuses(db_any: Any) -> None:
    """Every case in turn, in one database (the schema and the publication are reset between cases)."""
    conn = connect(resolve_dsn(db_any.dsn))
    try:
        with conn.cursor() as cur:
            for case, setup, clause, expected in CASES:
                _check_case(cur, case, setup, clause, expected)
    finally:
        conn.close()


def _check_case(cur: Any, case: str, setup: list[str], clause: str, expected: dict[str, str]) -> None:
    cur.execute("DROP PUBLICATION IF EXISTS p; DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    for statement in setup:
        cur.execute(statement)
    cur.execute(f"CREATE PUBLICATION p {clause}")
    found = {p.table: p.kind for p in identity_problems(cur, "p")}
    assert found == expected, case

    refused = set()
    cur.execute("SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = 'r'")
    for (table,) in cur.fetchall():
        cur.execute(f"INSERT INTO {table} (id, v) VALUES (1, 1)")
        try:
            cur.execute(f"UPDATE {table} SET v = v")
        except psycopg2.Error as exc:
            assert "replica identity" in str(exc), (case, str(exc))
            refused.add(f"public.{table}")
    assert refused == set(expected), case


def test_problem_messages_and_fixes(db: Any) -> None:
    db.execute('CREATE TABLE "Odd T" (id int PRIMARY KEY, v int)')
    db.execute("CREATE TABLE nokey (v int)")
    db.execute('CREATE PUBLICATION p FOR TABLE "Odd T" (v), nokey WITH (publish = \'update\')')
    conn = connect(resolve_dsn(db.dsn))
    try:
        with conn.cursor() as cur:
            listed, nokey = identity_problems(cur, "p")
    finally:
        conn.close()
    assert listed.message() == ("public.Odd T: the column list (v) does not cover the replica identity (id); "
                                "its UPDATE would fail on the source")
    assert listed.fix("p", for_create=True) == "add id to the column list, or --publish insert,truncate"
    assert not listed.full_fixes
    assert nokey.message() == ("public.nokey: it has no primary key (REPLICA IDENTITY DEFAULT); "
                               "its UPDATE would fail on the source")
    assert nokey.fix("p", for_create=True) == (
        "add a primary key to public.nokey, or --replica-identity-full (sets REPLICA IDENTITY FULL on the table), "
        "or --publish insert,truncate")
    assert nokey.fix("p", for_create=False) == (
        "add a primary key to public.nokey, or ALTER TABLE public.nokey REPLICA IDENTITY FULL, "
        "or ALTER PUBLICATION p SET (publish = 'insert, truncate')")
    assert nokey.full_fixes
