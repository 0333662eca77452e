"""Both writers (pyarrow in the task, Spark's as the fallback) give the same rows, schemas and typed tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.parquet_writer import WRITER_ENV
from tests.ingest.conftest import ingest, read_output


def _typed(spark: Any, out: str) -> list[dict[str, Any]]:
    frame = spark.read.option("mergeSchema", "true").parquet(str(Path(out) / "tables" / table_dir_name("public", "acct")))
    return [r.asDict(recursive=True) for r in frame.orderBy("_commit_lsn", "_seq").collect()]


def _fields(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_pyarrow_and_spark_writers_give_the_same_rows_schema_and_typed_tables(
    db: Any, spark: Any, tmp_path: Path, plugin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.require_plugin(plugin)
    db.execute("CREATE TABLE acct (id bigint PRIMARY KEY, balance numeric(12,2), at timestamptz, local_at timestamp, "
               "tags text[], raw bytea)")
    slots = {name: db.slot_name() for name in ("pyarrow", "spark")}
    for slot in slots.values():
        db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    pub: list[str] = []
    if plugin == "pgoutput":
        db.execute("CREATE PUBLICATION p FOR TABLE acct")
        pub = ["--publication", "p"]
    db.execute("INSERT INTO acct SELECT g, g * 1.25, '2024-06-01 12:00:50+02', '2024-06-01 12:00:50', "
               "ARRAY['a', g::text], '\\x00ff' FROM generate_series(1, 300) g")
    db.execute("UPDATE acct SET balance = 'NaN', tags = NULL WHERE id <= 5")
    db.execute("ALTER TABLE acct ADD COLUMN note text")
    db.execute("INSERT INTO acct (id, note) VALUES (1000, 'late')")
    db.execute("DELETE FROM acct WHERE id BETWEEN 6 AND 9")
    db.execute("SELECT pg_logical_emit_message(true, 'pfx', 'hello')")

    outs: dict[str, str] = {}
    for writer, slot in slots.items():
        monkeypatch.setenv(WRITER_ENV, writer)
        outs[writer] = str(tmp_path / writer)
        result = ingest(db.dsn, "--slot", slot, "--output", outs[writer], *pub, "--typed-tables", "--batch-changes", "250")
        assert result.exit_code == 0, result.stderr
        assert result.summary is not None and result.summary["writer"] == writer
        assert result.summary["batches"] >= 2

    # the partitions' ranges may differ: the second run also reads the first one's end-of-run heartbeat
    rows = {w: [{k: v for k, v in r.items() if k != "lsn_range"} for r in read_output(spark, out)]
            for w, out in outs.items()}
    assert rows["pyarrow"] == rows["spark"] and len(rows["pyarrow"]) == 300 + 5 + 1 + 4 + 1
    expected = _fields(spark.createDataFrame([], SPARK_DDL + ", lsn_range string").schema)
    for out in outs.values():
        assert _fields(spark.read.parquet(str(Path(out) / "changes")).schema) == expected

    typed = {w: [{k: v for k, v in r.items() if k != "lsn_range"} for r in _typed(spark, out)] for w, out in outs.items()}
    assert typed["pyarrow"] == typed["spark"]
    assert [(r["_op"], r["_commit_lsn"], r["_seq"]) for r in typed["pyarrow"]] == [
        (r["op"], r["commit_lsn"], r["seq"]) for r in rows["pyarrow"] if r["op"] != "M"
    ]
    for out in outs.values():  # both writers: TIMESTAMP(MICROS), UTC-adjusted for timestamptz, not for timestamp
        for path in (Path(out) / "changes").glob("lsn_range=*/*.parquet"):
            assert pq.read_schema(path).field("commit_ts").type == pa.timestamp("us", tz="UTC")
        for path in (Path(out) / "tables").glob("*/*/*.parquet"):
            kinds = pq.read_schema(path)
            assert kinds.field("at").type == pa.timestamp("us", tz="UTC") and kinds.field("local_at").type == pa.timestamp("us")
            assert kinds.field("_commit_ts").type == pa.timestamp("us", tz="UTC")
    ledgers = {w: (Path(out) / "_pgpoll" / "tables" / f"{table_dir_name('public', 'acct')}.json").read_text()
               for w, out in outs.items()}
    assert ledgers["pyarrow"] == ledgers["spark"]
