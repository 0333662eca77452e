"""The row filter examples of the PostgreSQL documentation, replayed through pgpoll.

Specification: PostgreSQL documentation, chapter "Logical Replication",
section "Row Filters", subsection "Examples"
(https://www.postgresql.org/docs/current/logical-replication-row-filter.html,
anchor LOGICAL-REPLICATION-ROW-FILTER-EXAMPLES; the same example in the
documentation of PostgreSQL 15 to 18). What the documentation's subscriber
shows after each step (``/* sub # */ SELECT * FROM ...``) is hard-coded below as
the expected materialized state: those rows are the specification, not what
the source happens to hold.

Each subscription of the documentation is one pgpoll consumer: one slot, the
publications the subscription names (pgoutput) or ``--row-filter`` flags
equivalent to them (test_decoding), one output path. A step is "ingest
--typed-tables, materialize, read the state" (:meth:`Consumer.step`).

Replica identity: the documentation creates ``t1`` with ``PRIMARY KEY(a, c)``
and does nothing about its replica identity, since p1's filter
``(a > 5 AND c = 'NSW')`` reads only key columns. The tests keep REPLICA
IDENTITY DEFAULT on ``t1`` too. ``t2``'s filter ``(e = 99)`` of ``p2`` reads
the non-key ``e``: PostgreSQL would refuse UPDATE and DELETE on ``t2`` while p2
publishes them, and the documentation's example never modifies ``t2``;
``pgpoll publication create`` and pgpoll's ``--row-filter`` refuse such a filter
(tested below), so both replays set ``t2`` to REPLICA IDENTITY FULL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from tests.ingest.conftest import confirmed_lsn, ingest, read_output
from tests.materialize.conftest import materialize, state_rows

P1_T1 = "(a > 5 AND c = 'NSW')"  # the documentation's p1: t1 WHERE (a > 5 AND c = 'NSW')


# ---- helpers ------------------------------------------------------------------------------


def rows(columns: str, *values: Any) -> list[dict[str, Any]]:
    """Rows as dicts, sorted: ``rows("a b", (1, 2), (3, 4))``; a single column takes bare values."""
    names = columns.split()
    return _sorted([dict(zip(names, v if isinstance(v, tuple) else (v,), strict=True)) for v in values])


def _sorted(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda r: tuple((v is None, v) for _, v in sorted(r.items())))


def pgpoll_cli(db: Any, *args: str) -> Any:
    """Run a ``pgpoll`` command in-process against ``db``; fail the test when it fails."""
    result = CliRunner().invoke(cli, list(args), env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0, f"pgpoll {' '.join(args)}: {result.stderr}"
    return result


def create_publication(db: Any, name: str, *tables: str, via_partition_root: bool = False) -> None:
    """``pgpoll publication create NAME --table T ...``."""
    args = ["publication", "create", name]
    for table in tables:
        args += ["--table", table]
    if via_partition_root:
        args.append("--via-partition-root")
    pgpoll_cli(db, *args)


def create_slot(db: Any, plugin: str) -> str:
    """``pgpoll slot create`` with a fresh name."""
    slot = db.slot_name()
    pgpoll_cli(db, "slot", "create", slot, "--plugin", plugin)
    return slot


@dataclass
class Step:
    """What one ingest + materialize produced."""

    tables: dict[str, list[dict[str, Any]]]  # materialized state of every table, sorted rows
    ops: list[tuple[str, str]]  # (table, op) of the changes this step's ingest wrote, in order


@dataclass
class Consumer:
    """One subscription of the documentation: a slot, its ingest options and an output path."""

    db: Any
    spark: Any
    slot: str
    output: str
    options: tuple[str, ...]
    _seen: int = field(default=0)

    def step(self) -> Step:
        """``pgpoll ingest --typed-tables``, ``pgpoll materialize``, then read every table's state."""
        run = ingest(self.db.dsn, "--slot", self.slot, "--output", self.output, "--typed-tables", *self.options)
        assert run.exit_code == 0, run.stderr
        code, tables, err = materialize(self.output)
        assert code == 0, err
        state: dict[str, list[dict[str, Any]]] = {}
        for table in tables:
            schema, name = table["table"].split(".")
            state[table["table"]] = _sorted(state_rows(self.spark, self.output, schema, name))
        changes = read_output(self.spark, self.output)
        new, self._seen = changes[self._seen:], len(changes)
        return Step(state, [(f"{c['schema_name']}.{c['table_name']}", c["op"]) for c in new])


def create_doc_tables(db: Any) -> None:
    """The documentation's tables (Examples: "Create some tables to be used in the following examples")."""
    db.execute("CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c))")
    db.execute("CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d))")
    db.execute("CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g))")


def insert_t2_t3(db: Any) -> None:
    """Rows for t2 and t3 (the documentation inserts none): each kind of match of p2's and p3's filters."""
    db.execute("INSERT INTO t2 VALUES (10, 1, 1)")  # d = 10 only (p3)
    db.execute("INSERT INTO t2 VALUES (11, 99, 2)")  # e = 99 only (p2)
    db.execute("INSERT INTO t2 VALUES (12, 5, 3)")  # neither
    db.execute("INSERT INTO t2 VALUES (13, NULL, 4)")  # e = 99 is NULL: no match
    db.execute("INSERT INTO t2 VALUES (99, 99, 5)")  # both
    db.execute("INSERT INTO t3 VALUES (10, 1, 1), (11, 2, 2), (12, 3, 3)")
    db.execute("UPDATE t3 SET h = 100 WHERE g = 10")  # stays inside g = 10: an UPDATE


# Expected t2/t3 for a consumer of p2 and p3: the filters of one table ORed ("Combining Multiple Row Filters").
T2_P2_OR_P3 = rows("d e f", (10, 1, 1), (11, 99, 2), (99, 99, 5))
T3_P3 = rows("g h i", (10, 100, 1))

# The documentation's subscriber t1 after each step (Examples, "/* sub # */ SELECT * FROM t1;").
DOC_T1_AFTER_INSERTS = rows("a b c", (6, 106, "NSW"), (9, 109, "NSW"))
DOC_T1_AFTER_UPDATE_INSIDE = rows("a b c", (9, 109, "NSW"), (6, 999, "NSW"))
DOC_T1_AFTER_UPDATE_ENTERING = rows("a b c", (9, 109, "NSW"), (6, 999, "NSW"), (555, 102, "NSW"))
DOC_T1_AFTER_UPDATE_LEAVING = rows("a b c", (6, 999, "NSW"), (555, 102, "NSW"))
# The publisher's t1 at the end (the last "/* pub # */ SELECT * FROM t1;").
DOC_PUB_T1_FINAL = rows(
    "a b c", (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT"), (7, 107, "NT"), (8, 108, "QLD"),
    (6, 999, "NSW"), (555, 102, "NSW"), (9, 109, "VIC"),
)
DOC_T1_INSERTS = [(2, 102, "NSW"), (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT"),
                  (6, 106, "NSW"), (7, 107, "NT"), (8, 108, "QLD"), (9, 109, "NSW")]
# The documentation's t1 steps: (what runs on the publisher, the subscriber's t1 after it, how it arrives).
DOC_T1_STEPS: list[tuple[list[str], list[dict[str, Any]], list[str]]] = [
    # "Only the rows satisfying the t1 WHERE clause of publication p1 are replicated."
    ([f"INSERT INTO t1 VALUES {v}" for v in DOC_T1_INSERTS], DOC_T1_AFTER_INSERTS, ["I", "I"]),
    # "old and new row values both satisfy the t1 WHERE clause ... The UPDATE replicates the change as normal."
    (["UPDATE t1 SET b = 999 WHERE a = 6"], DOC_T1_AFTER_UPDATE_INSIDE, ["U"]),
    # "old row values did not satisfy ... new row values do satisfy it. The UPDATE is transformed into an INSERT"
    (["UPDATE t1 SET a = 555 WHERE a = 2"], DOC_T1_AFTER_UPDATE_ENTERING, ["I"]),
    # "old row values satisfied ... new row values do not satisfy it. The UPDATE is transformed into a DELETE"
    (["UPDATE t1 SET c = 'VIC' WHERE a = 9"], DOC_T1_AFTER_UPDATE_LEAVING, ["D"]),
]


def run_t1_statements(db: Any) -> None:
    """Every publisher statement of the t1 example, without looking in between."""
    for statements, _, _ in DOC_T1_STEPS:
        for statement in statements:
            db.execute(statement)
    assert _sorted([dict(zip("abc", r, strict=True)) for r in db.execute("SELECT a, b, c FROM t1")]) == DOC_PUB_T1_FINAL


def replay_t1_example(db: Any, s1: Consumer) -> None:
    """The documentation's t1 steps for subscription s1 (publication p1), asserting the subscriber's t1 after each."""
    for statements, expected, ops in DOC_T1_STEPS:
        for statement in statements:
            db.execute(statement)
        step = s1.step()
        assert step.tables == {"public.t1": expected}, statements[-1]
        assert step.ops == [("public.t1", op) for op in ops], statements[-1]
    assert _sorted([dict(zip("abc", r, strict=True)) for r in db.execute("SELECT a, b, c FROM t1")]) == DOC_PUB_T1_FINAL


def insert_into_partitions(db: Any) -> None:
    """The documentation's inserts into ``parent`` and ``child``."""
    db.execute("INSERT INTO parent VALUES (2), (4), (6)")
    db.execute("INSERT INTO child VALUES (3), (5), (7)")


def create_partitioned_tables(db: Any) -> None:
    """The documentation's partitioned table ("Create a partitioned table on the publisher")."""
    db.execute("CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a)")
    db.execute("CREATE TABLE child PARTITION OF parent DEFAULT")


# ---- pgoutput: the publications of the documentation ----------------------------------------


def test_documented_row_filter_examples_pgoutput(db_any: Any, spark: Any, tmp_path: Path) -> None:
    db = db_any
    create_doc_tables(db)
    db.execute("ALTER TABLE t2 REPLICA IDENTITY FULL")  # p2's filter reads the non-key e (see the module docstring)
    create_publication(db, "p1", f"public.t1 WHERE {P1_T1}")
    create_publication(db, "p2", "public.t1", "public.t2 WHERE (e = 99)")
    create_publication(db, "p3", "public.t2 WHERE (d = 10)", "public.t3 WHERE (g = 10)")
    # the documentation's s1 subscribes to p1; s123 to all three (the same changes, another slot)
    s1 = Consumer(db, spark, create_slot(db, "pgoutput"), str(tmp_path / "s1"), ("--publication", "p1"))
    s123 = Consumer(db, spark, create_slot(db, "pgoutput"), str(tmp_path / "s123"), ("--publication", "p1,p2,p3"))
    insert_t2_t3(db)

    replay_t1_example(db, s1)

    # Several publications: a table's filters are ORed, and a publication without a filter on a table
    # (p2's t1) makes the others redundant ("Combining Multiple Row Filters"): t1 is published in full.
    step = s123.step()
    assert step.tables == {"public.t1": DOC_PUB_T1_FINAL, "public.t2": T2_P2_OR_P3, "public.t3": T3_P3}


def test_column_list_publishes_only_its_columns_pgoutput(db_any: Any, spark: Any, tmp_path: Path) -> None:
    """Not in the documentation: p1's table and filter with a column list (a, c)."""
    db = db_any
    create_doc_tables(db)
    create_publication(db, "p1_cols", f"public.t1 (a, c) WHERE {P1_T1}")
    cols = Consumer(db, spark, create_slot(db, "pgoutput"), str(tmp_path / "cols"), ("--publication", "p1_cols"))
    run_t1_statements(db)
    step = cols.step()
    # only the listed columns, and the documentation's final subscriber rows of t1 (the UPDATE of b, which
    # is not listed, arrives as an UPDATE of (6, 'NSW') with no old row: the key did not change)
    assert step.tables == {"public.t1": [{"a": r["a"], "c": r["c"]} for r in DOC_T1_AFTER_UPDATE_LEAVING]}


def test_documented_partitioned_example_pgoutput(db_any: Any, spark: Any, tmp_path: Path) -> None:
    db = db_any
    create_partitioned_tables(db)
    # "Create a publication p4 ... publish_via_partition_root is set as true"
    create_publication(db, "p4", "public.parent WHERE (a < 5)", "public.child WHERE (a >= 5)",
                       via_partition_root=True)
    s4 = Consumer(db, spark, create_slot(db, "pgoutput"), str(tmp_path / "s4"), ("--publication", "p4"))
    insert_into_partitions(db)
    step = s4.step()
    # "They replicate using the row filter of parent": changes land under the root's name only.
    assert step.tables == {"public.parent": rows("a", 2, 3, 4)}
    assert {table for table, _ in step.ops} == {"public.parent"}

    # "Repeat the same test, but ... publish_via_partition_root is set as false."
    pgpoll_cli(db, "publication", "drop", "p4")
    create_publication(db, "p4", "public.parent", "public.child WHERE (a >= 5)")
    db.execute("TRUNCATE parent")
    insert_into_partitions(db)
    step = s4.step()
    # "They replicate using the row filter of child": the subscriber's child holds 5, 6, 7.
    assert step.tables["public.child"] == rows("a", 5, 6, 7)
    assert [op for table, op in step.ops if op != "T"] == ["I", "I", "I"]
    assert {table for table, op in step.ops if op != "T"} == {"public.child"}


# ---- test_decoding: --row-filter flags equivalent to the publications -----------------------


def test_documented_row_filter_examples_test_decoding(db_any: Any, spark: Any, tmp_path: Path) -> None:
    db = db_any
    db.require_plugin("test_decoding")
    create_doc_tables(db)
    db.execute("ALTER TABLE t2 REPLICA IDENTITY FULL")  # p2's filter reads the non-key e (see the module docstring)
    # s1 = publication p1: its table and its filter
    s1 = Consumer(db, spark, create_slot(db, "test_decoding"), str(tmp_path / "s1"),
                  ("--tables", "public.t1", "--row-filter", f"public.t1: {P1_T1}"))
    # p1, p2 and p3 together: t1 unfiltered (p2 has no filter on it), t2's two filters ORed, t3's filter
    s123 = Consumer(db, spark, create_slot(db, "test_decoding"), str(tmp_path / "s123"), (
        "--tables", "public.t1,public.t2,public.t3",
        "--row-filter", "public.t2: (e = 99)", "--row-filter", "public.t2: (d = 10)",
        "--row-filter", "public.t3: (g = 10)",
    ))
    insert_t2_t3(db)

    replay_t1_example(db, s1)

    step = s123.step()
    assert step.tables == {"public.t1": DOC_PUB_T1_FINAL, "public.t2": T2_P2_OR_P3, "public.t3": T3_P3}


def test_documented_partitioned_example_test_decoding(db_any: Any, spark: Any, tmp_path: Path) -> None:
    db = db_any
    db.require_plugin("test_decoding")
    create_partitioned_tables(db)
    slot = create_slot(db, "test_decoding")
    out = str(tmp_path / "s4")
    insert_into_partitions(db)
    # publish_via_partition_root = true has no test_decoding equivalent (it reports every change under its
    # partition): a filter on the partitioned table is refused, before anything is read.
    before = confirmed_lsn(db, slot)
    run = ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables", "--row-filter", "public.parent: (a < 5)")
    assert run.exit_code == 2, run.stderr
    assert "partitioned" in run.stderr and "--row-filter per partition" in run.stderr
    assert confirmed_lsn(db, slot) == before and not Path(out).exists()

    # publish_via_partition_root = false: "parent, child WHERE (a >= 5)"; the documentation's second round
    db.execute("TRUNCATE parent")
    insert_into_partitions(db)
    s4 = Consumer(db, spark, slot, out, ("--tables", "public.parent,public.child", "--row-filter",
                                         "public.child: (a >= 5)"))
    step = s4.step()
    assert step.tables == {"public.child": rows("a", 5, 6, 7)}  # "/* sub # */ SELECT * FROM child"
    # every row change under the partition's name (the TRUNCATE also names parent, which holds no rows)
    assert {table for table, op in step.ops if op != "T"} == {"public.child"}
    assert [op for _, op in step.ops if op != "T"] == ["I"] * 6  # 5, 6, 7 before the TRUNCATE and after it


# ---- refusals ---------------------------------------------------------------------------------


def test_row_filter_outside_replica_identity_is_refused(db_any: Any, tmp_path: Path) -> None:
    db = db_any
    db.require_plugin("test_decoding")
    create_doc_tables(db)  # t2: PRIMARY KEY(d), REPLICA IDENTITY DEFAULT
    slot = create_slot(db, "test_decoding")
    insert_t2_t3(db)
    before = confirmed_lsn(db, slot)
    out = tmp_path / "out"
    run = ingest(db.dsn, "--slot", slot, "--output", str(out), "--typed-tables",
                 "--row-filter", "public.t2: (e = 99)")
    assert run.exit_code == 2, run.stderr
    assert "uses e, outside the replica identity" in run.stderr  # names the column
    assert 'fix: ALTER TABLE "public"."t2" REPLICA IDENTITY FULL, or filter on key columns only' in run.stderr
    assert confirmed_lsn(db, slot) == before and not out.exists()


def test_malformed_or_unsafe_row_filter_exits_2_before_touching_anything(db_any: Any, tmp_path: Path) -> None:
    db = db_any
    db.require_plugin("test_decoding")
    create_doc_tables(db)
    slot = create_slot(db, "test_decoding")
    db.execute("INSERT INTO t1 VALUES (6, 106, 'NSW')")
    before = confirmed_lsn(db, slot)
    out = tmp_path / "out"
    unreachable = "postgresql://nobody@127.0.0.1:1/nowhere"  # connecting would fail with exit 4
    for spec, expected in [
        ("t1: (a > 5); DROP TABLE t1", "';' is not allowed"),
        ("public.t1: (a > 5) OR true", "after the parenthesised expression"),
        ("public.t1: (upper(c) = 'NSW')", "function call upper(...) is not allowed"),
        ("public.t1: (a > 5 AND now() > '2000-01-01')", "function call now(...) is not allowed"),
        ("public.t1: a > 5", "must be in parentheses"),
    ]:
        for dsn in (db.dsn, unreachable):
            run = ingest(dsn, "--slot", slot, "--output", str(out), "--typed-tables", "--row-filter", spec)
            assert run.exit_code == 2, (spec, run.stderr)
            assert run.stderr.startswith("error: ") and expected in run.stderr, (spec, run.stderr)
    assert db.execute("SELECT to_regclass('public.t1') IS NOT NULL, count(*) FROM t1") == [(True, 1)]
    assert confirmed_lsn(db, slot) == before and not out.exists()


def test_row_filter_with_pgoutput_slot_exits_2(db_any: Any, tmp_path: Path) -> None:
    db = db_any
    create_doc_tables(db)
    create_publication(db, "p1", f"public.t1 WHERE {P1_T1}")
    slot = create_slot(db, "pgoutput")
    db.execute("INSERT INTO t1 VALUES (6, 106, 'NSW')")
    before = confirmed_lsn(db, slot)
    out = tmp_path / "out"
    run = ingest(db.dsn, "--slot", slot, "--output", str(out), "--typed-tables", "--publication", "p1",
                 "--row-filter", f"public.t1: {P1_T1}")
    assert run.exit_code == 2, run.stderr
    assert "--row-filter is for test_decoding slots" in run.stderr and "pgpoll publication create" in run.stderr
    assert confirmed_lsn(db, slot) == before and not out.exists()

