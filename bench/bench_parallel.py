"""Benchmark: a backlog drained with the slot alone and with temporary copies of it, side by side (issue 37).

On one throwaway server, for each backlog shape (pgoutput and test_decoding in
10,000-row transactions, pgoutput in one transaction), interleaved run by run
so that the machine's load falls on every column alike, medians of
``--repeat``:

* the server's decode: ``count(*)`` over one peek of the whole backlog, beside
  the same backlog decoded as ingest cuts it with ``--decode-parallelism 2``
  (the slot peeked up to the split while a temporary copy, made and advanced
  to the split on its own connection, peeks from it, both at once; the copy's
  set-up counted) — goal <= 0.7x;
* ``ingest`` at the defaults (``jobs/ingest.py``, a process as users run it)
  with ``--decode-parallelism`` 1, 2 and 3, each net of an empty run, over the
  single-peek decode — goal <= 1.5x for the 10,000-row shapes; one huge
  transaction cannot be cut and must not get slower;
* the advance of the slot over the whole backlog after the batch (fast-forward
  decoding, part of every drain above), timed on a temporary copy;
* the CPU each drain costs, net of an empty run: the ingest process's own
  (``RUSAGE_CHILDREN``) and the server's (every PostgreSQL process: the
  postmaster's reaped children and the live ones, from ``/proc``, sampled
  once the run's backends are reaped; autovacuum is off on this server, so
  that no worker's CPU falls into a run), and the
  lowest drain ratio that much work allows on the machine's cores — on two
  cores a drain cannot finish before half its CPU time has passed.

    python bench/bench_parallel.py [--changes 1000000] [--repeat 5] [--shapes pgoutput,test_decoding,one-txn]
                                   [--parallelisms 1,2,3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
from bench_ingest import SETTINGS, _fill, _fresh_table, _sql, ingest_run

from pgpoll.ingest.decode_ranges import split_points
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

PEEK = {
    "pgoutput": ("pg_logical_slot_peek_binary_changes",
                 "'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true'"),
    "test_decoding": ("pg_logical_slot_peek_changes", "'include-xids', '1', 'include-timestamp', '1'"),
}
PARALLELISMS = [1, 2, 3]


def _lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def _count(dsn: str, slot: str, plugin: str, upto: str | None, prelude: list[str] | None = None,
           drop: bool = False) -> tuple[float, int]:
    """Seconds and rows of ``count(*)`` over a peek of ``slot`` (after ``prelude``, in the same transaction;
    ``drop``: drop the slot, a temporary copy, before it ends)."""
    func, options = PEEK[plugin]
    conn = psycopg2.connect(dsn)
    try:
        started = time.perf_counter()
        with conn.cursor() as cur:
            for statement in prelude or []:
                cur.execute(statement)
            cur.execute(f"SELECT count(*) FROM {func}(%s, %s::pg_lsn, NULL, {options})", (slot, upto))
            rows = int(cur.fetchone()[0])
            seconds = time.perf_counter() - started
            if drop:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.rollback()
        return seconds, rows
    finally:
        conn.close()


def server_split(dsn: str, slot: str, plugin: str, start: int, end: int) -> tuple[float, int]:
    """The slot up to ingest's split and a temporary copy from it, at once: wall seconds and rows together."""
    (split,) = split_points(start, end, 2)
    results: dict[str, tuple[float, int]] = {}
    copy = "bench_copy"
    prelude = [f"SELECT pg_copy_logical_replication_slot('{slot}', '{copy}', true)",
               f"SELECT pg_replication_slot_advance('{copy}', '{_lsn(split)}')"]

    def lower() -> None:
        results["lower"] = _count(dsn, slot, plugin, _lsn(split))

    def upper() -> None:
        results["upper"] = _count(dsn, copy, plugin, None, prelude, drop=True)

    started = time.perf_counter()
    threads = [threading.Thread(target=f) for f in (lower, upper)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, results["lower"][1] + results["upper"][1]


def advance_seconds(dsn: str, slot: str) -> float:
    """``pg_replication_slot_advance`` over the whole backlog, on a temporary copy (the slot stays)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT pg_copy_logical_replication_slot('{slot}', 'bench_adv', true)")
            started = time.perf_counter()
            cur.execute("SELECT pg_replication_slot_advance('bench_adv', pg_current_wal_lsn())")
            seconds = time.perf_counter() - started
            cur.execute("SELECT pg_drop_replication_slot('bench_adv')")
        conn.rollback()
        return seconds
    finally:
        conn.close()


def _postmaster(dsn: str) -> int:
    """The server's postmaster process id (the parent of a backend)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            backend = int(cur.fetchone()[0])
        return int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])  # while it lives
    finally:
        conn.close()


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (``[1]`` ppid, ``[11:15]`` utime, stime, cutime,
    cstime in clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(postmaster: int) -> dict[int, float]:
    """The server's live processes (zombies too, until the postmaster reaps them): their own CPU seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                f = _stat(entry)
            except OSError:
                continue
            if int(f[1]) == postmaster:
                found[int(entry)] = (int(f[11]) + int(f[12])) / tick
    return found


def server_cpu(postmaster: int) -> float:
    """CPU seconds of every process of the server so far: the postmaster's own and its reaped children's
    (utime, stime, cutime, cstime), and its live children's own."""
    own = _stat(postmaster)
    return sum(int(own[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK") + sum(_children(postmaster).values())


def _settled(postmaster: int, before: set[int], timeout: float = 10.0) -> None:
    """Wait until every server process started since ``before`` has been reaped: one still exiting counts its
    CPU in neither the live processes nor the reaped ones at the sample, but in the next drain's."""
    deadline = time.monotonic() + timeout
    while set(_children(postmaster)) - before and time.monotonic() < deadline:
        time.sleep(0.02)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(cluster: ThrowawayCluster, shape: str, changes: int, repeat: int, work: Path) -> dict[str, Any]:
    """Every figure of one backlog shape, interleaved run by run."""
    plugin = "test_decoding" if shape == "test_decoding" else "pgoutput"
    dsn = cluster.dsn()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    _fresh_table(conn)
    names = {p: [f"{shape.replace('-', '_')}_p{p}_{i}" for i in range(repeat)] for p in PARALLELISMS}
    for slot in ["srv", *(s for group in names.values() for s in group)]:
        _sql(conn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    start = int(_sql(conn, "SELECT pg_current_wal_lsn() - '0/0'")[0][0])
    _fill(conn, changes, changes if shape == "one-txn" else 10_000)
    end = int(_sql(conn, "SELECT pg_current_wal_lsn() - '0/0'")[0][0])
    _sql(conn, "CHECKPOINT")
    _sql(conn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'empty'")
    _sql(conn, "SELECT 1 FROM pg_create_logical_replication_slot('empty', %s)", (plugin,))
    single, split, empty, empty_cpu, empty_server = [], [], [], [], []
    drains: dict[int, list[float]] = {p: [] for p in PARALLELISMS}
    client: dict[int, list[float]] = {p: [] for p in PARALLELISMS}
    server: dict[int, list[float]] = {p: [] for p in PARALLELISMS}
    postmaster = _postmaster(dsn)
    counts: set[int] = set()
    for i in range(repeat):
        seconds, rows = _count(dsn, "srv", plugin, None)
        single.append(seconds)
        seconds, together = server_split(dsn, "srv", plugin, start, end)
        split.append(seconds)
        before = set(_children(postmaster))
        cpu, on_server = _children_cpu(), server_cpu(postmaster)
        empty.append(ingest_run(dsn, "empty", str(work / f"empty-{shape}-{i}"), plugin)[0])
        _settled(postmaster, before)
        empty_cpu.append(_children_cpu() - cpu)
        empty_server.append(server_cpu(postmaster) - on_server)
        for p in PARALLELISMS:
            cpu, on_server = _children_cpu(), server_cpu(postmaster)
            seconds, summary, _rss = ingest_run(dsn, names[p][i], str(work / f"{names[p][i]}"), plugin,
                                                env_extra={"PGPOLL_DECODE_PARALLELISM": str(p)})
            drains[p].append(seconds)
            _settled(postmaster, before)
            client[p].append(_children_cpu() - cpu)
            server[p].append(server_cpu(postmaster) - on_server)
            counts.add(int(summary["changes"]))
        print(f"  {shape} run {i + 1}: single peek {single[-1]:.2f} s, split {split[-1]:.2f} s "
              f"({rows} / {together} rows), empty {empty[-1]:.2f} s, "
              + ", ".join(f"p{p} {drains[p][-1]:.2f} s" for p in PARALLELISMS), flush=True)
    assert counts == {changes}, counts
    advance = advance_seconds(dsn, "srv")
    conn.close()
    med = statistics.median
    return {"shape": shape, "single": med(single), "split": med(split), "empty": med(empty), "advance": advance,
            "drain": {p: med(v) - med(empty) for p, v in drains.items()},
            "client_cpu": {p: med(v) - med(empty_cpu) for p, v in client.items()},
            "server_cpu": {p: med(v) - med(empty_server) for p, v in server.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shapes", default="pgoutput,test_decoding,one-txn")
    parser.add_argument("--parallelisms", default="1,2,3", help="the --decode-parallelism values to drain with")
    args = parser.parse_args()
    PARALLELISMS[:] = [int(p) for p in args.parallelisms.split(",")]
    found = find_bindirs()
    inst = found.get(15) or found[max(found)]
    cluster = ThrowawayCluster(inst, settings={**SETTINGS, "max_replication_slots": "64", "autovacuum": "off"}).start()
    results = []
    try:
        with tempfile.TemporaryDirectory() as work:
            for shape in args.shapes.split(","):
                results.append(measure(cluster, shape, args.changes, args.repeat, Path(work)))
    finally:
        cluster.stop()
    print(f"\n{args.changes:,} changes, medians of {args.repeat}, PostgreSQL {inst.major}; drains net of an empty run\n")
    print("| backlog | one peek | slot + 1 copy (ratio) | advance | " + " | ".join(
        f"drain p={p} (/ peek)" for p in PARALLELISMS) + " |")
    print("|---|---|---|---|" + "---|" * len(PARALLELISMS))
    for r in results:
        cells = [f"{r['drain'][p]:.2f} s ({r['drain'][p] / r['single']:.2f}x)" for p in PARALLELISMS]
        print(f"| {r['shape']} | {r['single']:.2f} s | {r['split']:.2f} s ({r['split'] / r['single']:.2f}x) | "
              f"{r['advance']:.2f} s | " + " | ".join(cells) + " |")
    cores = os.cpu_count() or 1
    print(f"\nCPU seconds of each drain (medians, each net of an empty run): ingest's own + the server's; the lowest "
          f"drain / peek ratio that much work allows on {cores} cores\n")
    print("| backlog | " + " | ".join(f"p={p}: client + server (lowest ratio)" for p in PARALLELISMS) + " |")
    print("|---|" + "---|" * len(PARALLELISMS))
    for r in results:
        cells = [f"{r['client_cpu'][p]:.2f} + {r['server_cpu'][p]:.2f} s "
                 f"({(r['client_cpu'][p] + r['server_cpu'][p]) / cores / r['single']:.2f}x)" for p in PARALLELISMS]
        print(f"| {r['shape']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
