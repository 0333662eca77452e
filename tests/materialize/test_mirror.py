"""Mirror equality: after a random workload captured over several ingest runs with crashes in between,
every materialized table equals ``SELECT * FROM`` the source, row for row and value for value.

Both plugins, every PostgreSQL version of the matrix. The workload covers inserts, updates, deletes,
key updates, a keyless REPLICA IDENTITY FULL table with duplicate rows, truncates, NULLs, TOASTed
values over 8 kB updated and not updated (also across key changes), every type of the mapping, and
an ADD COLUMN mid-stream. Typed values are compared as values (pgpoll.testing.value_compare).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgpoll.sink.layout import table_dir_name
from pgpoll.testing.pytest_plugin import primary_version
from pgpoll.testing.value_compare import comparable_lake, comparable_source
from pgpoll.typed.conversions import Unrepresentable, parse_value
from pgpoll.typed.schemas import TableSchema
from tests.ingest.conftest import ingest, ingest_process
from tests.materialize.conftest import materialize

# column name -> (SQL type, random literal maker)
Gen = Callable[[random.Random], str]


def _pick(*values: str) -> Gen:
    return lambda r: r.choice(values)


TYPED_COLUMNS: dict[str, tuple[str, Gen]] = {
    "c_bool": ("boolean", _pick("true", "false")),
    "c_int2": ("smallint", lambda r: str(r.randint(-32768, 32767))),
    "c_int8": ("bigint", lambda r: str(r.randint(-2**63, 2**63 - 1))),
    "c_float4": ("real", _pick("1.5", "-0.1", "'NaN'", "'Infinity'", "3.4e38")),
    "c_float8": ("double precision", lambda r: r.choice([repr(r.uniform(-1e9, 1e9)), "'-Infinity'", "'NaN'", "1e-300"])),
    "c_dec": ("numeric(12,3)", lambda r: r.choice([f"{r.randint(-10**8, 10**8)}.{r.randint(0, 999):03d}", "'NaN'"])),
    "c_num": ("numeric", _pick("1e40", "'Infinity'", "-0.000000001", "123456789012345678901234567890.5")),
    "c_text": ("text", lambda r: "'" + r.choice(["plain", "ünï ©ode", "quote '' inside", "", "line\nbreak"]) + "'"),
    "c_varchar": ("varchar(20)", _pick("'short'", "'x'")),
    "c_char": ("char(5)", _pick("'ab'", "'abcde'")),
    "c_bytea": ("bytea", _pick("'\\x00ff10'::bytea", "''::bytea", "'\\xdeadbeef'::bytea")),
    "c_date": ("date", _pick("'2024-02-29'", "'0044-03-15 BC'", "'infinity'", "'1999-12-31'")),
    "c_time": ("time", _pick("'13:14:15.123456'", "'00:00'", "'24:00:00'")),
    "c_timetz": ("timetz", _pick("'13:14:15+05:30'", "'01:02:03-08'")),
    "c_ts": ("timestamp", _pick("'2024-01-02 03:04:05.678901'", "'-infinity'", "'1970-01-01'")),
    "c_tstz": ("timestamptz", _pick("'2024-06-01 12:00:00+02'", "'2000-01-01 00:00:00.000001+00'", "'infinity'")),
    "c_interval": ("interval", _pick("'1 year 2 months 3 days 04:05:06.789'", "'-1 day +02:00'", "'0'")),
    "c_uuid": ("uuid", _pick("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'")),
    "c_json": ("json", _pick("'{\"a\": [1, 2]}'", "'null'", "'\"s\"'")),
    "c_jsonb": ("jsonb", _pick("'{\"b\": {\"c\": true}}'", "'[]'")),
    "c_inet": ("inet", _pick("'192.168.0.1'", "'10.0.0.0/8'", "'::1'")),
    "c_cidr": ("cidr", _pick("'10.1.0.0/16'",)),
    "c_macaddr": ("macaddr", _pick("'08:00:2b:01:02:03'",)),
    "c_ints": ("integer[]", _pick("'{1,NULL,3}'", "'{}'", "'{{1,2},{3,4}}'")),
    "c_texts": ("text[]", _pick("'{\"a b\",\"NULL\",NULL,\"q\\\"uote\"}'", "'{x}'")),
    "c_mood": ("mood", _pick("'happy'", "'sad'")),
    "c_posint": ("posint", _pick("1", "42")),
    "c_range": ("int4range", _pick("'[1,5)'", "'empty'")),
    "c_money": ("money", _pick("12.34",)),
    "c_bit": ("bit(3)", _pick("B'101'",)),
    "c_varbit": ("varbit", _pick("B'1'", "B'0110'")),
    "c_tsv": ("tsvector", _pick("'a fat cat'",)),
}

# compared on their exact text (psycopg2 reads time '24:00:00' as 00:00, so it is no oracle for time)
PLAIN_KINDS = {"exact", "time", "timetz"}


def _literal(r: random.Random, name: str) -> str:
    if r.random() < 0.15:
        return "NULL"
    return TYPED_COLUMNS[name][1](r)


class Workload:
    """Random changes on four tables; keeps nothing itself — the source is the truth."""

    def __init__(self, db: Any, seed: int) -> None:
        self.db = db
        self.r = random.Random(seed)
        self.next_id = 1

    def create(self) -> None:
        db = self.db
        db.execute("CREATE TYPE mood AS ENUM ('happy', 'sad')")
        db.execute("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
        cols = ", ".join(f"{n} {t}" for n, (t, _g) in TYPED_COLUMNS.items())
        db.execute(f"CREATE TABLE t_types (id int PRIMARY KEY, {cols})")
        db.execute("CREATE TABLE t_toast (id int PRIMARY KEY, big text, note text)")
        db.execute("ALTER TABLE t_toast ALTER COLUMN big SET STORAGE EXTERNAL")
        db.execute("CREATE TABLE t_full (a int, b text)")
        db.execute("ALTER TABLE t_full REPLICA IDENTITY FULL")
        db.execute("CREATE TABLE t_trunc (id int PRIMARY KEY, v text)")

    def _ids(self, table: str) -> list[int]:
        return [row[0] for row in self.db.execute(f"SELECT id FROM {table} ORDER BY id")]

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _big(self) -> str:
        return "'" + "".join(self.r.choice("abcdefghij") for _ in range(9000)) + "'"

    def statement(self) -> str:
        r = self.r
        kind = r.choice(["types_ins", "types_ins", "types_upd", "types_key", "types_del", "toast_ins", "toast_note",
                         "toast_big", "toast_key", "toast_del", "full_ins", "full_upd", "full_del", "trunc_ins", "trunc"])
        if kind == "types_ins":
            names = list(TYPED_COLUMNS)
            values = ", ".join(_literal(r, n) for n in names)
            return f"INSERT INTO t_types (id, {', '.join(names)}) VALUES ({self._new_id()}, {values})"
        if kind.startswith("types_"):
            ids = self._ids("t_types")
            if not ids:
                return "SELECT 1"
            victim = r.choice(ids)
            if kind == "types_upd":
                names = r.sample(list(TYPED_COLUMNS), 3)
                sets = ", ".join(f"{n} = {_literal(r, n)}" for n in names)
                return f"UPDATE t_types SET {sets} WHERE id = {victim}"
            if kind == "types_key":
                return f"UPDATE t_types SET id = {self._new_id()}, c_text = 'moved' WHERE id = {victim}"
            return f"DELETE FROM t_types WHERE id = {victim}"
        if kind == "toast_ins":
            return f"INSERT INTO t_toast VALUES ({self._new_id()}, {self._big()}, 'new')"
        if kind.startswith("toast_"):
            ids = self._ids("t_toast")
            if not ids:
                return "SELECT 1"
            victim = r.choice(ids)
            if kind == "toast_note":  # big not changed: not sent, carried forward
                return f"UPDATE t_toast SET note = 'note {r.randint(0, 99)}' WHERE id = {victim}"
            if kind == "toast_big":
                return f"UPDATE t_toast SET big = {self._big()} WHERE id = {victim}"
            if kind == "toast_key":  # key change with the large value unchanged
                return f"UPDATE t_toast SET id = {self._new_id()} WHERE id = {victim}"
            return f"DELETE FROM t_toast WHERE id = {victim}"
        if kind == "full_ins":  # duplicates on purpose
            return f"INSERT INTO t_full VALUES ({r.randint(1, 3)}, {r.choice(['NULL', chr(39) + 'x' + chr(39)])})"
        if kind == "full_upd":
            return (
                f"UPDATE t_full SET b = 'u{r.randint(0, 2)}' "
                f"WHERE ctid = (SELECT ctid FROM t_full WHERE a = {r.randint(1, 3)} LIMIT 1)"
            )
        if kind == "full_del":
            return f"DELETE FROM t_full WHERE ctid = (SELECT ctid FROM t_full WHERE a = {r.randint(1, 3)} LIMIT 1)"
        if kind == "trunc_ins":
            return f"INSERT INTO t_trunc VALUES ({self._new_id()}, 'v')"
        return "TRUNCATE t_trunc" if r.random() < 0.5 else "SELECT 1"

    def run(self, statements: int) -> None:
        """``statements`` random statements, grouped into random transactions."""
        conn = self.db.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                done = 0
                while done < statements:
                    size = self.r.randint(1, 5)
                    for _ in range(size):
                        cur.execute(self.statement())
                        done += 1
                    conn.commit()
        finally:
            conn.close()


def _state_schema(out: Path, table: str, state: str = "state") -> TableSchema:
    marker = json.loads((out / state / table_dir_name("public", table) / "_pgpoll_state.json").read_text())
    return TableSchema.from_json((out / "_pgpoll" / "schemas" / f"{marker['schema_id']}.json").read_text())


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _typed_select(column: str, t: Any) -> str:
    """The column for psycopg2, with values Python's datetime cannot hold (BC, infinity) as NULL: those are compared as text."""
    if t.kind in ("date", "timestamp", "timestamptz"):
        return f"CASE WHEN {column}::text ~ '(BC|infinity)' THEN NULL ELSE {column} END"
    return column


def _source_value(t: Any, typed: Any, text: Any) -> tuple[str, Any]:
    """A source value as the lake must hold it: the exact text where the typed column cannot (pgpoll's rule)."""
    if text is None:
        return ("value", None)
    if t.kind in PLAIN_KINDS:
        return ("text", text)
    try:
        parse_value(t, text)
    except Unrepresentable:
        return ("text", text)
    return ("value", comparable_source(typed, t))


def _assert_mirror(db: Any, spark: Any, out: Path, table: str, state: str = "state") -> None:
    described = _state_schema(out, table, state)
    names = list(described.names)
    source_names = [r[0] for r in db.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,))]
    assert names == source_names, f"{table}: state columns {names} != source columns {source_names}"
    types = {c.name: c.type for c in described.columns}
    select = ", ".join(f"{_typed_select(quote_ident(n), types[n])}, {quote_ident(n)}::text" for n in names)
    source: list[tuple[Any, ...]] = []
    for row in db.execute(f"SELECT {select} FROM {table}"):
        source.append(tuple(_source_value(types[n], row[2 * i], row[2 * i + 1]) for i, n in enumerate(names)))
    frame = spark.read.parquet(str(out / state / table_dir_name("public", table)))
    extra: list[tuple[Any, ...]] = []
    for row in frame.collect():
        untyped = row["_untyped"] or {}
        values = []
        for n in names:
            if n in untyped:
                values.append(("text", untyped[n]))
            elif row[n] is None:
                values.append(("value", None))
            elif types[n].kind in PLAIN_KINDS:
                values.append(("text", row[n]))
            else:
                values.append(("value", comparable_lake(row[n], types[n])))
        match = next((i for i, s in enumerate(source) if s == tuple(values)), None)
        if match is None:
            extra.append(tuple(values))
        else:
            source.pop(match)  # a multiset: each source row matches one state row
    assert not source and not extra, f"{table}: {_explain(names, source, extra)}"


def _explain(names: list[str], missing: list[tuple[Any, ...]], extra: list[tuple[Any, ...]]) -> str:
    """Which columns differ between a source row and the state row with the same first column."""
    lines = [f"{len(missing)} row(s) only in the source, {len(extra)} only in the state"]
    by_first = {}
    for row in extra:
        by_first[repr(row[0])] = row
    for row in missing[:3]:
        other = by_first.get(repr(row[0]))
        if other is None:
            lines.append(f"source row {row[:2]}... has no state row with the same {names[0]}")
            continue
        diffs = [f"{n}: source {a!r} state {b!r}" for n, a, b in zip(names, row, other, strict=False) if a != b]
        lines.append(f"{names[0]}={row[0][1]!r}: " + "; ".join(diffs))
    return "\n".join(lines)


FAULTS = ["after-peek", "mid-write", "after-write", "after-commit-log", "after-advance"]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_materialized_tables_mirror_the_source(db_any: Any, spark: Any, tmp_path: Path, plugin: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Both engines: ``state`` computed in the driver (small tables), ``state-spark`` with Spark. The Spark engine
    computes from the typed tables, not the server, so it runs on the primary version only (the matrix's cost)."""
    db = db_any
    both_engines = db.major == primary_version()
    db.require_plugin(plugin)
    work = Workload(db, seed=db.major * 10 + (plugin == "pgoutput"))
    work.create()
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    args = ["--slot", slot, "--output", str(tmp_path / "out"), "--typed-tables", "--batch-changes", "40"]
    if plugin == "pgoutput":
        db.execute("CREATE PUBLICATION mirror FOR TABLE t_types, t_toast, t_full, t_trunc")
        args += ["--publication", "mirror"]
    out = tmp_path / "out"
    r = random.Random(7)
    for round_number in range(3):
        work.run(60)
        if round_number == 1:
            db.execute("ALTER TABLE t_types ADD COLUMN c_added text")  # mid-stream, between changes
            work.db.execute("UPDATE t_types SET c_added = 'after add' WHERE id IN (SELECT id FROM t_types LIMIT 2)")
            work.run(20)
        fault = r.choice(FAULTS)
        crashed = ingest_process(db.dsn, *args, env={"PGPOLL_FAULT": fault})
        assert crashed.exit_code == 137, f"fault {fault}: {crashed.stderr[-2000:]}"
        finished = ingest(db.dsn, *args)
        assert finished.exit_code == 0, finished.stderr
        code, tables, err = materialize(str(out))
        assert code == 0, err
        assert {t.get("engine") for t in tables} <= {"driver", None}, tables
        if both_engines:
            with monkeypatch.context() as env:
                env.setenv("PGPOLL_MATERIALIZE_ENGINE", "spark")
                code, by_spark, err = materialize(str(out), "--to", str(out / "state-spark"))
            assert code == 0, err
            assert {t.get("engine") for t in by_spark} <= {"spark", None}, by_spark
        for table in ("t_types", "t_toast", "t_full", "t_trunc"):
            for state in ("state", "state-spark") if both_engines else ("state",):
                if (out / state / table_dir_name("public", table)).exists():
                    _assert_mirror(db, spark, out, table, state)
    assert {t["table"] for t in tables} >= {"public.t_types", "public.t_toast", "public.t_full"}
    # a full rebuild gives the same state
    code, _tables, err = materialize(str(out), "--full")
    assert code == 0, err
    for table in ("t_types", "t_toast", "t_full", "t_trunc"):
        if (out / "state" / table_dir_name("public", table)).exists() or db.execute(f"SELECT count(*) FROM {table}")[0][0]:
            _assert_mirror(db, spark, out, table)
