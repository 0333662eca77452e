"""Capture real test_decoding output lines as golden test data.

Starts a throwaway PostgreSQL cluster (``pgpoll.testing.cluster``) for each
server with test_decoding (15, 17, 18 here; PG16's wheel lacks it), runs one
workload per case on its own slot, and peeks it with each option set of the
case under pinned session settings. Every output row becomes a JSON line
``{"lsn", "xid", "data"}`` in
``tests/decode/golden/test_decoding/pg<major>/<case>[_<variant>].jsonl``; the
options, settings and server version go to ``<case>[_<variant>].meta.json``.
The expected values are written by hand in ``test_test_decoding_golden.py``
from the SQL below.

Usage (re-runnable; it overwrites the files of the versions it captures)::

    .venv/bin/python tests/decode/capture_test_decoding_golden.py
    .venv/bin/python tests/decode/capture_test_decoding_golden.py --major 15
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

GOLDEN = Path(__file__).resolve().parent / "golden" / "test_decoding"
SESSION_SETTINGS = (
    "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; "
    "SET extra_float_digits = 1; SET bytea_output = 'hex'"
)
XIDS_TS = {"include-xids": "1", "include-timestamp": "1"}
NOXIDS_SKIP = {"include-xids": "0", "skip-empty-xacts": "1"}
STREAM = {"stream-changes": "1", "include-xids": "1", "include-timestamp": "1"}
STREAM_NOXIDS = {"stream-changes": "1", "include-xids": "0", "skip-empty-xacts": "1"}
STREAM_ROWS = 200  # rows of ~500 bytes: well over logical_decoding_work_mem = 64kB
Conn: TypeAlias = psycopg2.extensions.connection

SCHEMA_SQL = """
CREATE SCHEMA "My Schema";
CREATE SCHEMA myschema;
CREATE TYPE myschema.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE public."Weird type" AS ENUM ('a b', 'c''d');
CREATE DOMAIN public.posint AS integer CHECK (VALUE > 0);
CREATE TABLE "My Schema"."we""ird.tbl: [x]" (
    id integer PRIMARY KEY, "col:a[b]" text, "Ünïcødé" text, "sp ace" varchar(10),
    "a.b" integer, "select" boolean);
CREATE TABLE public.types (
    id integer PRIMARY KEY, i2 smallint, i8 bigint, o oid, f4 real, f8 double precision,
    n numeric, n2 numeric(10,2), b boolean, bt bit(4), vb bit varying(8), t text,
    vc varchar(20), c char(3), ts timestamp, tstz timestamptz, d date, iv interval,
    j jsonb, by bytea, u uuid, ai integer[], "at" text[], avc varchar[], m myschema.mood,
    w "Weird type", wa "Weird type"[], dom posint, ch "char", nm name);
CREATE TABLE public.rfull (id integer, t text, n integer);
ALTER TABLE public.rfull REPLICA IDENTITY FULL;
CREATE TABLE public.nokey (id integer, t text);
CREATE TABLE public.rnothing (id integer PRIMARY KEY, t text);
ALTER TABLE public.rnothing REPLICA IDENTITY NOTHING;
CREATE TABLE public.ruidx (id integer NOT NULL, code text NOT NULL, t text);
CREATE UNIQUE INDEX ruidx_code ON public.ruidx (code);
ALTER TABLE public.ruidx REPLICA IDENTITY USING INDEX ruidx_code;
CREATE TABLE public.toasty (id integer PRIMARY KEY, big text, small integer);
ALTER TABLE public.toasty ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE public.tr_a (id serial PRIMARY KEY);
CREATE TABLE public.tr_b (id serial PRIMARY KEY);
CREATE TABLE public.tr_parent (id integer PRIMARY KEY);
CREATE TABLE public.tr_child (id integer PRIMARY KEY, pid integer REFERENCES public.tr_parent);
CREATE TABLE "My Schema"."tr, odd: name" (id integer);
CREATE TABLE public.tpc (id integer PRIMARY KEY, t text);
CREATE TABLE public.big (id integer, pad text);
"""

# ---- workloads: (statements run in autocommit, each string one transaction) ----------------

BASIC = [
    """INSERT INTO "My Schema"."we""ird.tbl: [x]" VALUES (1, 'x:y''z', 'ü', 'a b', 5, true)""",
    r"""INSERT INTO public.types VALUES
        (1, -32768, 9223372036854775807, 4294967295, 'NaN', '-Infinity', 'Infinity', 123.45,
         true, B'0101', B'101', E'it''s\na\\b', 'vc', 'ab', '2026-01-02 03:04:05.5',
         '2026-01-02 03:04:05.123456+02', '2026-01-02', '1 day 02:03:04',
         '{"a": [1, "x y"]}', '\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         '{1,NULL,3}', '{"a b","c\"d",NULL}', '{x}', 'happy', 'c''d', '{"a b","c''d"}', 7, 'q',
         'nm'),
        (2, NULL, NULL, NULL, 1.5e-07, 1e+100, '-Infinity', NULL, false, NULL, B'', '', NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{}', NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL)""",
    """INSERT INTO public.types (id, t) VALUES
        (4, 'table public.x: INSERT: a[integer]:1'' b[text]:''q'' new-tuple: c[int]:2')""",
    "UPDATE public.types SET t = 'upd' WHERE id = 1; UPDATE public.types SET id = 3 WHERE id = 2;"
    " DELETE FROM public.types WHERE id = 3",
    """SELECT pg_logical_emit_message(true, 'pfx, sz: 3 content:', E'multi\\nline\\nBEGIN 5');
       SELECT pg_logical_emit_message(true, '', '');
       SELECT pg_logical_emit_message(true, 'uni', 'čeština 😀');
       INSERT INTO public.tpc VALUES (100, 'with messages')""",
    "SELECT pg_logical_emit_message(false, 'hb', 'beat')",
    "INSERT INTO public.tpc VALUES (101, 'flush')",
    "BEGIN; INSERT INTO public.tpc VALUES (10, 'a'); SAVEPOINT s;"
    " INSERT INTO public.tpc VALUES (11, 'rolled back'); ROLLBACK TO s;"
    " INSERT INTO public.tpc VALUES (12, 'b'); COMMIT",
    "CREATE TABLE public.emptyddl (x integer)",
    "SELECT pg_logical_emit_message(true, 'only', 'message')",
    "INSERT INTO public.tpc VALUES (102, 'last')",
]

IDENTITY = [
    "INSERT INTO public.rfull VALUES (1, 'a', NULL)",
    "UPDATE public.rfull SET n = 5 WHERE id = 1",
    "DELETE FROM public.rfull WHERE id = 1",
    "INSERT INTO public.nokey VALUES (1, 'a'); UPDATE public.nokey SET t = 'b';"
    " DELETE FROM public.nokey",
    "INSERT INTO public.rnothing VALUES (1, 'a'); UPDATE public.rnothing SET t = 'b';"
    " DELETE FROM public.rnothing",
    "INSERT INTO public.ruidx VALUES (1, 'k1', 'a'); UPDATE public.ruidx SET t = 'b';"
    " UPDATE public.ruidx SET code = 'k2'; DELETE FROM public.ruidx",
    "INSERT INTO public.toasty VALUES (1, repeat('abcdefghij', 1000), 1)",
    "UPDATE public.toasty SET small = 2",
    "DELETE FROM public.toasty",
]

TRUNCATE = [
    "INSERT INTO public.tr_a DEFAULT VALUES; INSERT INTO public.tr_parent VALUES (1);"
    " INSERT INTO public.tr_child VALUES (1, 1)",
    "TRUNCATE public.tr_a, public.tr_b",
    "TRUNCATE public.tr_a RESTART IDENTITY",
    "TRUNCATE public.tr_parent CASCADE",
    """TRUNCATE public.tr_a, "My Schema"."tr, odd: name" RESTART IDENTITY CASCADE""",
]

TWOPHASE = [
    "BEGIN; INSERT INTO public.tpc VALUES (1, 'one'); PREPARE TRANSACTION 'g1'",
    "COMMIT PREPARED 'g1'",
    r"BEGIN; INSERT INTO public.tpc VALUES (2, 'two'); PREPARE TRANSACTION E'it''s\\hard, txid 5'",
    r"ROLLBACK PREPARED E'it''s\\hard, txid 5'",
    "BEGIN; INSERT INTO public.tpc VALUES (3, 'three'); PREPARE TRANSACTION 'skip_nodecode'",
    "COMMIT PREPARED 'skip_nodecode'",
    "BEGIN; INSERT INTO public.tpc VALUES (4, 'four'); PREPARE TRANSACTION 'pending'",
]


def _big(first: int, n: int) -> str:
    return (
        f"INSERT INTO public.big SELECT g, repeat('p', 500) "
        f"FROM generate_series({first}, {first + n - 1}) g"
    )


STREAMING = [
    "BEGIN; " + _big(1, STREAM_ROWS) + "; SELECT pg_logical_emit_message(true, 'sm', 'in stream');"
    " TRUNCATE public.tr_b; COMMIT",
    "BEGIN; " + _big(1001, STREAM_ROWS) + "; ROLLBACK",
    "BEGIN; " + _big(2001, STREAM_ROWS) + "; SAVEPOINT s; " + _big(3001, STREAM_ROWS)
    + "; ROLLBACK TO s; INSERT INTO public.big VALUES (4001, 'after'); COMMIT",
    "INSERT INTO public.big VALUES (5001, 'small')",
]

STREAM_TWOPHASE = [
    "BEGIN; " + _big(6001, STREAM_ROWS) + "; PREPARE TRANSACTION 'sp1'",
    "COMMIT PREPARED 'sp1'",
]


# ---- capture --------------------------------------------------------------------------------


def _connect(dsn: str) -> Conn:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def _peek(dsn: str, slot: str, options: dict[str, str], work_mem: str | None) -> list[dict[str, Any]]:
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(SESSION_SETTINGS)
            if work_mem:
                cur.execute("SET logical_decoding_work_mem = %s", (work_mem,))
            flat = [x for kv in options.items() for x in kv]
            cur.execute(
                "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_changes("
                "%s, NULL, NULL" + ", %s" * len(flat) + ")",
                [slot, *flat],
            )
            return [{"lsn": lsn, "xid": xid, "data": data} for lsn, xid, data in cur.fetchall()]
    finally:
        conn.close()


def _write(outdir: Path, name: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    with (outdir / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (outdir / f"{name}.meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"  {name}: {len(rows)} lines")


def _case(
    dsn: str,
    outdir: Path,
    version: str,
    case: str,
    statements: list[str],
    variants: dict[str, dict[str, str]],
    *,
    twophase: bool = False,
    work_mem: str | None = None,
    after: Callable[[Conn, str], dict[str, list[dict[str, Any]]]] | None = None,
) -> None:
    slot = f"golden_{case}"
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, %s)",
                (slot, twophase),
            )
            started = datetime.now(UTC)
            for statement in statements:
                cur.execute(statement)
            cur.execute("SELECT pg_switch_wal()")  # flushes the non-transactional message
            time.sleep(0.2)
            finished = datetime.now(UTC)
        for variant, options in variants.items():
            rows = _peek(dsn, slot, options, work_mem)
            meta = {
                "server_version": version,
                "slot": slot,
                "twophase": twophase,
                "options": options,
                "session_settings": SESSION_SETTINGS,
                "logical_decoding_work_mem": work_mem,
                "captured_from": started.isoformat(),
                "captured_to": finished.isoformat(),
            }
            _write(outdir, f"{case}{variant}", rows, meta)
        if after is not None:
            for name, rows in after(conn, slot).items():
                meta = {"server_version": version, "slot": slot, "twophase": twophase,
                        "options": XIDS_TS, "session_settings": SESSION_SETTINGS}
                _write(outdir, f"{case}_{name}", rows, meta)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    finally:
        conn.close()


def _twophase_after(dsn: str) -> Callable[[Conn, str], dict[str, list[dict[str, Any]]]]:
    def run(conn: Conn, slot: str) -> dict[str, list[dict[str, Any]]]:
        before = _peek(dsn, slot, XIDS_TS, None)
        prepare_lsn = next(r["lsn"] for r in before if r["data"].startswith("PREPARE TRANSACTION 'pending'"))
        with conn.cursor() as cur:
            cur.execute("COMMIT PREPARED 'pending'")
        committed = _peek(dsn, slot, XIDS_TS, None)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_replication_slot_advance(%s, %s)", (slot, prepare_lsn))
        advanced = _peek(dsn, slot, XIDS_TS, None)
        return {"committed": committed, "advanced": advanced}

    return run


def capture(major: int, bindir: Path) -> None:
    """Run every workload on a fresh server of ``major`` and write its golden files."""
    inst = next(i for i in find_bindirs().values() if i.bindir == bindir)
    cluster = ThrowawayCluster(inst).start()
    try:
        if "test_decoding" not in cluster.plugins:
            print(f"PostgreSQL {major}: no test_decoding plugin; skipped")
            return
        outdir = GOLDEN / f"pg{major}"
        outdir.mkdir(parents=True, exist_ok=True)
        dsn = cluster.dsn()
        conn = _connect(dsn)
        with conn.cursor() as cur:
            cur.execute(SCHEMA_SQL)
            cur.execute("SHOW server_version")
            row = cur.fetchone()
            assert row is not None
            version = str(row[0])
        conn.close()
        print(f"PostgreSQL {version} -> {outdir}")
        plain = {"": XIDS_TS, "_noxids": NOXIDS_SKIP}
        _case(dsn, outdir, version, "basic", BASIC, plain)
        _case(dsn, outdir, version, "identity", IDENTITY, {"": XIDS_TS})
        _case(dsn, outdir, version, "truncate", TRUNCATE, {"": XIDS_TS})
        _case(dsn, outdir, version, "twophase", TWOPHASE, plain, twophase=True, after=_twophase_after(dsn))
        streams = {"": STREAM, "_noxids": STREAM_NOXIDS}
        _case(dsn, outdir, version, "stream", STREAMING, streams, work_mem="64kB")
        _case(dsn, outdir, version, "stream_twophase", STREAM_TWOPHASE, streams, twophase=True, work_mem="64kB")
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    """Capture golden files for every server found (or the ``--major`` given)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--major", type=int, action="append", help="only this major version")
    args = parser.parse_args(argv)
    found = find_bindirs()
    for major, inst in found.items():
        if args.major and major not in args.major:
            continue
        if not inst.has_test_decoding:
            print(f"PostgreSQL {major} ({inst.bindir}): no test_decoding; skipped")
            continue
        capture(major, inst.bindir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
