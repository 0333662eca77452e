"""Benchmark: pgoutput decoding speed against the server's own decoding time.

Starts a throwaway PostgreSQL (or uses ``--dsn``), creates a 5-column table and
a publication, inserts N rows in one transaction into a ``pgoutput`` slot
(``proto_version '1'``), then measures:

1. server: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``
   -- the server decoding WAL and running pgoutput, nothing sent;
2. fetch: the same peek through a psycopg2 named cursor into memory (once);
3. decode, fast path: every row through ``PgoutputDecoder.decode_row`` (plain
   tuples; other messages through ``decode``);
4. decode, events: every row through ``PgoutputDecoder.decode`` (change-model
   dataclasses).

Each timing is the best of ``--repeat`` runs (the machine may be shared). It
prints changes/s and ``decode_time / server_time`` (goal: <= 0.5 for the fast
path). Run standalone::

    python bench/bench_decode.py [--changes N] [--dsn DSN] [--bindir DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgpoll.decode.pgoutput_decoder import PgoutputDecoder

SLOT = "pgpoll_bench_slot"
PUBLICATION = "pgpoll_bench_pub"
PEEK = (
    "pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
    " 'proto_version', '1', 'publication_names', %s)"
)


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


class ThrowawayCluster:
    """initdb + start in a temp dir (as ``postgres`` when root); ``stop()`` removes it."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="pgpoll-bench-decode-")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        subprocess.run(
            _as_postgres([f"{bindir}/initdb", "-D", self.data, "--auth=trust", "-U", "postgres", "-E", "UTF8"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c wal_level=logical"
            " -c max_replication_slots=4 -c max_wal_senders=4 -c fsync=off -c max_wal_size=4GB"
        )
        subprocess.run(
            _as_postgres([f"{bindir}/pg_ctl", "-D", self.data, "-o", opts, "-l", f"{self.dir}/log", "-w", "start"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def _setup(conn: Any, changes: int) -> None:
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS pgpoll_bench")
        cur.execute(
            "CREATE TABLE pgpoll_bench (id int PRIMARY KEY, name text, score numeric,"
            " created timestamptz, note text)"
        )
        cur.execute("DROP PUBLICATION IF EXISTS pgpoll_bench_pub")
        cur.execute("CREATE PUBLICATION pgpoll_bench_pub FOR TABLE pgpoll_bench")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        cur.execute("BEGIN")
        cur.execute(
            "INSERT INTO pgpoll_bench SELECT g, 'name-' || g, g * 1.5,"
            " '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 second', 'note for row ' || g"
            " FROM generate_series(1, %s) g",
            (changes,),
        )
        cur.execute("COMMIT")


def _teardown(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        cur.execute("DROP PUBLICATION pgpoll_bench_pub")
        cur.execute("DROP TABLE pgpoll_bench")


def _decode_fast(rows: list[tuple[Any, ...]]) -> int:
    dec = PgoutputDecoder(1)
    decode_row, decode = dec.decode_row, dec.decode
    n = 0
    for row in rows:
        data = row[2]
        if decode_row(data) is None:
            decode(data)
        else:
            n += 1
    return n


def _decode_events(rows: list[tuple[Any, ...]]) -> int:
    decode = PgoutputDecoder(1).decode
    for row in rows:
        decode(row[2])
    return len(rows)


def _best(repeat: int, fn: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs: the machine is shared, the minimum is the least disturbed."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run(dsn: str, changes: int, repeat: int = 3) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        t = time.perf_counter()
        _setup(conn, changes)
        print(f"setup: {changes:,} rows inserted in {time.perf_counter() - t:.1f}s", flush=True)
        with conn.cursor() as cur:
            counted: list[int] = []

            def count() -> None:
                cur.execute("SELECT count(*) FROM " + PEEK, (SLOT, PUBLICATION))
                counted.append((cur.fetchone() or (0,))[0])

            server = _best(repeat, count)
        print(f"server: count(*) of {counted[0]:,} output rows in {server:.2f}s (best of {repeat})", flush=True)
        conn.autocommit = False
        t = time.perf_counter()
        with conn.cursor(name="pgpoll_bench_fetch") as cur:
            cur.itersize = 20000
            cur.execute("SELECT lsn, xid, data FROM " + PEEK, (SLOT, PUBLICATION))
            rows = list(cur)
        conn.rollback()
        conn.autocommit = True
        fetch = time.perf_counter() - t
        print(f"fetch: {len(rows):,} rows through a named cursor in {fetch:.2f}s", flush=True)

        decoded = _decode_fast(rows)
        fast = _best(repeat, lambda: _decode_fast(rows))
        events = _best(repeat, lambda: _decode_events(rows))
        rows.clear()  # free the fetched rows before printing
        for label, secs in (("decode (fast path, decode_row)", fast), ("decode (events, decode)", events)):
            print(
                f"{label}: {secs:.2f}s (best of {repeat}), {decoded / secs:,.0f} changes/s,"
                f" {secs / decoded * 1e6:.2f} us/change, decode/server = {secs / server:.2f}",
                flush=True,
            )
        _teardown(conn)
    finally:
        conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pgoutput decode benchmark")
    parser.add_argument("--changes", type=int, default=1_000_000, help="rows to insert (default 1,000,000)")
    parser.add_argument("--dsn", help="use this server instead of starting a throwaway one")
    parser.add_argument("--bindir", default="/usr/lib/postgresql/15/bin", help="PostgreSQL bin directory")
    parser.add_argument("--repeat", type=int, default=3, help="time each measurement this often, keep the best")
    args = parser.parse_args(argv)
    if args.dsn:
        run(args.dsn, args.changes, args.repeat)
        return 0
    cluster = ThrowawayCluster(args.bindir)
    try:
        run(cluster.dsn, args.changes, args.repeat)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
