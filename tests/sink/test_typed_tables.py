"""--typed-tables: each table's typed changes land beside the envelope, in the same commit, through schema changes."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pgpoll.sink.layout import table_dir_name
from tests.ingest.conftest import capture_args, ingest, read_output
from tests.materialize.conftest import materialize, state_rows


def _typed(spark: Any, out: str, schema: str, table: str) -> list[dict[str, Any]]:
    frame = spark.read.option("mergeSchema", "true").parquet(str(Path(out) / "tables" / table_dir_name(schema, table)))
    return [r.asDict(recursive=True) for r in frame.orderBy("_commit_lsn", "_seq").collect()]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_typed_rows_match_the_envelope_and_carry_types(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    db.execute("CREATE TABLE acct (id bigint PRIMARY KEY, balance numeric(12,2), opened date, active boolean, tags text[])")
    args = capture_args(db, plugin, "acct")
    out = str(tmp_path / "out")
    db.execute("INSERT INTO acct VALUES (1, 10.50, '2024-01-31', true, '{a,\"b c\"}'), (2, 'NaN', NULL, false, NULL)")
    db.execute("UPDATE acct SET balance = 11 WHERE id = 1")
    db.execute("DELETE FROM acct WHERE id = 2")
    assert ingest(db.dsn, *args, "--output", out, "--typed-tables").exit_code == 0
    envelope = [r for r in read_output(spark, out) if r["op"] != "M"]
    typed = _typed(spark, out, "public", "acct")
    assert [(r["_op"], r["_commit_lsn"], r["_seq"], r["_xid"]) for r in typed] == [
        (r["op"], r["commit_lsn"], r["seq"], r["xid"]) for r in envelope
    ]
    # the full 64-bit ids of the writing transactions; the commit-log records hold their range
    assert all(r["xid"] is not None for r in envelope)
    assert typed[0]["id"] == 1 and typed[0]["balance"] == Decimal("10.50") and typed[0]["active"] is True
    assert str(typed[0]["opened"]) == "2024-01-31" and typed[0]["tags"] == ["a", "b c"]
    # NaN cannot be a decimal: the typed column is null and the exact text is kept
    assert typed[1]["balance"] is None and typed[1]["_untyped"] == {"balance": "NaN"}
    assert typed[2]["balance"] == Decimal("11.00")
    assert typed[3]["_op"] == "D" and typed[3]["id"] == 2
    # every change row of the envelope names its table shape, stored once under _pgpoll/schemas
    for row in envelope:
        described = json.loads((Path(out) / "_pgpoll" / "schemas" / f"{row['schema_id']}.json").read_text())
        assert described["table"] == "acct" and described["key"] == ["id"]
    records = [json.loads(p.read_text()) for p in sorted((Path(out) / "_pgpoll" / "commits").glob("*.json"))]
    with_rows = [r for r in records if r["rows"]]
    assert with_rows[-1]["tables"] == ["public.acct"]
    xids = sorted({r["xid"] for r in envelope})
    # (test_decoding also shows the empty transaction of CREATE PUBLICATION: the range covers it too)
    assert min(r["xid_min"] for r in with_rows) <= xids[0] and max(r["xid_max"] for r in with_rows) >= xids[-1]
    # the run's heartbeat is a transaction of its last batch (taken in by the batch whose peek read to the end of
    # WAL): that batch's range ends at its id, past every writer's
    assert records[-1]["xid_max"] > xids[-1]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_add_drop_and_retype_columns_read_with_merge_schema(db: Any, spark: Any, tmp_path: Path, plugin: str) -> None:
    db.execute("CREATE TABLE evo (id int PRIMARY KEY, a int, b text)")
    args = capture_args(db, plugin, "evo")
    out = str(tmp_path / "out")
    db.execute("INSERT INTO evo VALUES (1, 1, 'one')")
    assert ingest(db.dsn, *args, "--output", out, "--typed-tables").exit_code == 0
    db.execute("ALTER TABLE evo ADD COLUMN c date")
    db.execute("INSERT INTO evo VALUES (2, 2, 'two', '2024-02-02')")
    db.execute("ALTER TABLE evo DROP COLUMN b")
    db.execute("INSERT INTO evo VALUES (3, 3, '2024-03-03')")
    db.execute("ALTER TABLE evo ALTER COLUMN a TYPE text USING a::text || '!'")
    db.execute("INSERT INTO evo VALUES (4, 'four', NULL)")
    db.execute("UPDATE evo SET a = 'one again' WHERE id = 1")
    assert ingest(db.dsn, *args, "--output", out, "--typed-tables").exit_code == 0
    rows = {r["id"]: r for r in _typed(spark, out, "public", "evo")}
    # ADD COLUMN: earlier rows read it as null; DROP COLUMN: later rows read the dropped one as null;
    # a type change: the column is written as <name>__<type> from then on
    assert rows[1]["c"] is None and rows[2]["c"].isoformat() == "2024-02-02"
    assert rows[2]["b"] == "two" and rows[3]["b"] is None
    assert rows[3]["a"] == 3 and rows[4]["a"] is None and rows[4]["a__string"] == "four"
    code, _tables, err = materialize(out)
    assert code == 0, err
    state = sorted(state_rows(spark, out, "public", "evo"), key=lambda r: r["id"])
    # the state has the table's current columns; rows last changed before the type change are cast
    # (PostgreSQL rewrote them with the USING expression, which no change event reports: documented)
    assert sorted(state[0]) == ["a", "c", "id"]
    assert [(r["id"], r["a"], r["c"] and r["c"].isoformat()) for r in state] == [
        (1, "one again", None), (2, "2", "2024-02-02"), (3, "3", "2024-03-03"), (4, "four", None)
    ]
