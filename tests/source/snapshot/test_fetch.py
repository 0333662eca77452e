"""Chunks read in binary through ADBC hold exactly what the same chunks read as CSV text hold, on every version.

The oracle is the server's own text (the CSV path: output functions under the pinned settings, converted as
a change's text is). Edge values of every kind the binary path reads natively (infinity, BC and 5-digit
years, NaN, -0, the largest oid, char(n) padding) and of kinds it reads as the server's text (numeric,
"char" with a high byte, inet, arrays, enums, domains, ranges...), for both plugins' column descriptions.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from pgpoll.snapshot.chunk_task import typed_chunk
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.snapshot.catalog import describe_table
from pgpoll.source.snapshot.chunks import written_since
from pgpoll.source.snapshot.fetch import BinaryChunkReader
from pgpoll.source.snapshot.reads import ChunkSpec, stream_chunk
from pgpoll.typed.native_values import format_date, format_timestamp

_TABLE = """
CREATE TYPE mood AS ENUM ('sad', 'ok');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE wide (
  id int PRIMARY KEY, b bool, s smallint, i int, l bigint, o oid, r real, f float8, n numeric(10,2), u numeric,
  t text, v varchar(5), c char(4), nm name, ch "char", by bytea, d date, ts timestamp, tz timestamptz(3), tm time,
  ttz timetz, iv interval, uu uuid, js json, jb jsonb, ip inet, cr cidr, mac macaddr, ia int[], ta text[],
  m mood, p posint, rg int4range, bits bit(3))
"""
_ROWS = [
    "1, true, -32768, -2147483648, -9223372036854775808, 4294967295, 'NaN', '-0', 'NaN', 'Infinity', '', '', 'a', "
    "'nm', E'\\\\200', '\\x', 'infinity', 'infinity', 'infinity', '24:00', '00:00+05:30', '1 year 2 mons -3 days 04:05:06.5', "
    "'00000000-0000-0000-0000-000000000000', '{\"a\":  1}', '{\"b\": [1, 2.50]}', '10.0.0.1/32', '10.0.0.0/8', "
    "'08:00:2b:01:02:03', '{1,NULL,3}', '{\"a,b\",NULL,\"\"}', 'ok', 1, '[1,5)', B'101'",
    "2, false, 32767, 2147483647, 9223372036854775807, 0, 'Infinity', 1e-300, 12345678.91, 1e-300, 'ünï ☃\n\"x\"', 'abc', "
    "'', '', 'x', '\\x00ff', '-infinity', '-infinity', '-infinity', '00:00:00.000001', '23:59:59.999999-12', "
    "'-178000000 years', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 'null', '[]', '::1', '::/0', 'ff:ff:ff:ff:ff:ff', "
    "'{}', '{}', 'sad', 2147483647, 'empty', B'000'",
    "3, NULL, NULL, NULL, NULL, NULL, '-Infinity', 5e-324, -0.01, 123456789012345678901234567890.123456789, NULL, NULL, "
    "NULL, NULL, NULL, NULL, '0044-03-15 BC', '0044-03-15 12:30:00.5 BC', '0001-12-31 23:59:59.999 BC', NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{{1,2},{3,4}}', NULL, NULL, NULL, NULL, NULL",
    "4, NULL, 0, 0, 0, 1, 1.1, 0.1, 0, -0.000, repeat('toast ', 20000), NULL, 'abcd', NULL, NULL, NULL, "
    "'10000-01-01', '10000-01-01 00:00:00.000001', '294276-12-31 23:59:59.999+00', '12:00', '12:00+00', "
    "'0', gen_random_uuid(), '{}', '{}', NULL, NULL, NULL, NULL, '{\"\\\\\\\\\"}', NULL, NULL, '(,)', NULL",
    "5, true, 1, 1, 1, 2, 3.5, 2.5, 1.5, 1, 'x', 'x', 'x', 'x', 'x', '\\x01', '0001-01-01', '0001-01-01 00:00:00', "
    "'9999-12-31 23:59:59.999+00', '01:02:03', '01:02:03+01', '1 day', gen_random_uuid(), '1', '1', '1.2.3.4', "
    "'1.2.3.0/24', '00:00:00:00:00:00', '{7}', '{z}', 'ok', 5, '[2,3]', B'111'",
]


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_binary_chunks_hold_exactly_what_csv_chunks_hold(db_any: Any, plugin: str) -> None:
    db = db_any
    db.require_plugin(plugin)
    db.execute(_TABLE)
    for row in _ROWS:
        db.execute(f"INSERT INTO wide VALUES ({row})")
    conn = connect(resolve_dsn(db.dsn))
    try:
        t = describe_table(conn, "public", "wide", plugin=plugin)
    finally:
        conn.close()
    chunk = ChunkSpec(0)
    with stream_chunk(db.dsn, t, chunk, lock_timeout_ms=2000) as s:
        assert not s.native
        text = typed_chunk(pa.Table.from_batches(list(s.batches), schema=pa.schema([(n, pa.string()) for n in t.names])),
                           t.table_schema)
    reader = BinaryChunkReader(db.dsn)
    try:
        for _ in range(2):  # one connection, one transaction per chunk
            with reader.chunk(t, chunk, lock_timeout_ms=2000) as s:
                native = s.native
                binary = typed_chunk(pa.Table.from_batches(list(s.batches)), t.table_schema, native)
            assert db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgpoll-snapshot' "
                              "AND backend_xmin IS NOT NULL")[0][0] == 0  # between chunks: no snapshot held
    finally:
        reader.close()
    assert any(native) and not all(native)
    natives = {"b", "s", "i", "l", "o", "r", "f", "t", "v", "c", "nm", "by", "d", "ts", "tz"}
    assert {n for n, flag in zip(t.names, native, strict=True) if flag} >= natives - {"o"}
    assert binary.schema == text.schema and binary.num_rows == text.num_rows == len(_ROWS)
    binary, text = binary.sort_by("id"), text.sort_by("id")
    for name in binary.schema.names:  # value for value, fallback texts (_untyped) included
        assert repr(binary.column(name).to_pylist()) == repr(text.column(name).to_pylist()), name


def test_a_recheck_reads_only_rows_written_since_a_transaction(db: Any) -> None:
    db.execute("CREATE TABLE r (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO r SELECT g, 'old' FROM generate_series(1, 50) g")
    since = int(db.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")[0][0])
    db.execute("UPDATE r SET v = 'new' WHERE id IN (3, 7)")
    db.execute("BEGIN; SAVEPOINT s; UPDATE r SET id = 99 WHERE id = 9; RELEASE s; COMMIT")  # a subtransaction's xid
    db.execute("VACUUM (FREEZE) r")  # a frozen tuple keeps its raw xmin
    conn = connect(resolve_dsn(db.dsn))
    try:
        t = describe_table(conn, "public", "r", plugin="test_decoding")
    finally:
        conn.close()
    reader = BinaryChunkReader(db.dsn)
    try:
        with reader.chunk(t, ChunkSpec(1_000_000, relation=("public", "r"), blocks=(0, None)), lock_timeout_ms=2000,
                          extra=(written_since(since),)) as s:
            got = sorted(pa.Table.from_batches(list(s.batches)).column("id").to_pylist())
    finally:
        reader.close()
    assert got == [3, 7, 99]


@pytest.mark.parametrize("days", [0, -1, 1, -730_120, 2_914_000, -2_451_545, 2**31 - 1, -(2**31)])
def test_dates_print_as_the_server_prints_them(db: Any, days: int) -> None:
    expected = db.execute("SELECT ('2000-01-01'::date + %s)::text", (days,))[0][0] if abs(days) < 2**31 - 1 else (
        "infinity" if days > 0 else "-infinity")
    assert format_date(days) == expected


@pytest.mark.parametrize("us", [0, -1, 1_500_000, -63_000_000_000_000_000 - 123_456, 253_402_300_800_000_001,
                                9_223_371_331_199_999_999, 2**63 - 1, -(2**63)])
def test_timestamps_print_as_the_server_prints_them(db: Any, us: int) -> None:
    if abs(us) >= 2**63 - 1:
        expected = ("infinity" if us > 0 else "-infinity",) * 2
    else:
        days, rest = divmod(us, 86_400_000_000)
        expected = db.execute("SET TimeZone = 'UTC'; SELECT t::text, t::timestamptz::text FROM (SELECT '2000-01-01'::timestamp"
                              " + (%s || ' days')::interval + (%s || ' microseconds')::interval AS t) x", (days, rest))[0]
    assert (format_timestamp(us, zone=False), format_timestamp(us, zone=True)) == tuple(expected)
