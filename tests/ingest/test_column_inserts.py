"""The fast pgoutput path (ADBC fetch into Arrow, runs of Inserts decoded column-wise) writes what the row path writes.

The reference is the batch task as it was: psycopg2's fetch and every row
through the row-by-row decoder (``column_inserts=False``). Both read the
same peek of a real server (a peek never moves the slot) and must give equal
record batches, column for column, and equal outcomes — on a workload that
mixes long runs of Inserts with what breaks them: other tables, updates,
deletes, a TRUNCATE, a logical message, a transaction larger than one Arrow
batch (spilled), booleans, NULLs, empty strings, quotes, Unicode, bytea, a
TOAST-sized value, a table the filter leaves out and rows below the
high-water mark. Also: through PgBouncer in both pool modes, and the
server's errors reach the caller as the same pgpoll errors.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgpoll.errors import ConfigError, SlotBusyError, SlotNotFoundError
from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
from pgpoll.source.arrow_peek import FETCH_ENV, choose_fetch, requested_fetch
from pgpoll.source.slots import peek_options
from pgpoll.table_patterns import TablePatterns
from pgpoll.testing.cluster import wait_until
from tests.cli.conftest import pg_recvlogical
from tests.ingest.conftest import ingest

_OUTCOME = ("peeked_rows", "changes", "advance_to", "first_commit_lsn", "last_commit_lsn", "first_commit_ts",
            "last_commit_ts", "xid_min", "xid_max", "open_transaction_at_end", "schemas")


def _workload(db: Any, plugin: str = "pgoutput") -> str:
    db.execute("CREATE TABLE wide (id int PRIMARY KEY, ok boolean, name text, note text, raw bytea, n numeric, "
               "tags text[], doc jsonb)")
    db.execute("CREATE TABLE other (k bigint PRIMARY KEY, v text)")
    db.execute("CREATE TABLE skipped (k int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub_cols FOR TABLE wide, other, skipped")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    db.execute("""INSERT INTO wide SELECT g, CASE g % 3 WHEN 0 THEN true WHEN 1 THEN false END,
                  CASE WHEN g % 5 = 0 THEN '' ELSE 'näme ''' || g || E'\\n"q"' END, NULL, decode(md5(g::text), 'hex'),
                  g / 7.0, ARRAY['a', g::text], jsonb_build_object('g', g) FROM generate_series(1, 3000) g""")
    with db.connect(autocommit=False) as conn, conn.cursor() as cur:  # short runs: inserts into two tables, alternating
        for i in range(40):
            cur.execute("INSERT INTO other VALUES (%s, %s)", (i, "☃" * (i % 3)))
            if i % 2:
                cur.execute("INSERT INTO wide (id, ok) VALUES (%s, NULL)", (10_000 + i,))
        cur.execute("SELECT pg_logical_emit_message(true, 'cols', 'mid-transaction')")
        cur.execute("INSERT INTO skipped SELECT generate_series(1, 50)")
        conn.commit()
    db.execute("UPDATE wide SET note = repeat('toast', 40000) WHERE id = 7")
    db.execute("INSERT INTO wide (id, note) VALUES (20000, repeat(md5('x'), 5000))")  # a TOAST-sized new value
    db.execute("UPDATE wide SET ok = NOT ok, name = NULL WHERE id % 11 = 0")
    db.execute("DELETE FROM wide WHERE id BETWEEN 100 AND 120")
    db.execute("TRUNCATE other")
    db.execute("INSERT INTO other SELECT g, 'after truncate' FROM generate_series(1, 2500) g")
    return slot


def _read(dsn: str, slot: str, *, fast: bool, rows_per_batch: int = 1000, hwm: int | None = None,
          tables: TablePatterns | None = None, plugin: str = "pgoutput") -> tuple[pa.Table, BatchOutcome]:
    spec = BatchSpec(
        dsn=dsn, slot=slot, plugin=plugin,
        options=tuple(peek_options(plugin, publications=["pub_cols"] if plugin == "pgoutput" else None)),
        upto_nchanges=None, high_water_mark=hwm, tables=tables or TablePatterns(), rows_per_arrow_batch=rows_per_batch,
        fetch="adbc" if fast else "psycopg2", column_inserts=fast,
    )
    outcome = BatchOutcome()
    batches = list(iter_batch(spec, outcome))
    assert outcome.error is None, outcome.error
    return pa.Table.from_batches(batches).combine_chunks(), outcome


def _same(dsn: str, slot: str, **kwargs: Any) -> pa.Table:
    fast, fast_outcome = _read(dsn, slot, fast=True, **kwargs)
    slow, slow_outcome = _read(dsn, slot, fast=False, **kwargs)
    assert fast_outcome.fetch == "adbc" and slow_outcome.fetch == "psycopg2"
    assert slow_outcome.column_rows == 0
    assert fast_outcome.column_rows >= (fast.num_rows - 200) * 0.9  # nearly every INSERT went column-wise
    assert fast.schema == slow.schema
    for name in slow.column_names:  # column by column, so a difference names its column
        assert fast.column(name).to_pylist() == slow.column(name).to_pylist(), name
    for name in _OUTCOME:
        assert getattr(fast_outcome, name) == getattr(slow_outcome, name), name
    return slow


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_the_fast_path_writes_what_the_row_path_writes(db: Any, plugin: str) -> None:
    db.require_plugin(plugin)
    slot = _workload(db, plugin)
    table = _same(db.dsn, slot, plugin=plugin)
    ops = table.column("op").to_pylist()
    assert ops.count("I") == 3000 + 40 + 20 + 50 + 1 + 2500 and ops.count("T") == 1 and ops.count("M") == 1
    assert table.column("seq").to_pylist()[:3] == [0, 1, 2]
    # a high-water mark inside the backlog, a table filter, one Arrow batch per transaction's worth
    commits = sorted(set(table.column("commit_lsn").to_pylist()))
    _same(db.dsn, slot, hwm=commits[2], plugin=plugin)
    _same(db.dsn, slot, tables=TablePatterns((), ("public.other",)), plugin=plugin)
    _same(db.dsn, slot, rows_per_batch=65536, plugin=plugin)


def test_the_adbc_fetch_through_pgbouncer(db: Any, pooled_dsn: str) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION pub_cols FOR TABLE items")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")
    pooled = _same(pooled_dsn, slot)
    direct, _ = _read(db.dsn, slot, fast=True)
    assert pooled.equals(direct) and pooled.num_rows == 500


def test_server_errors_are_pgpoll_errors(db: Any) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub_cols FOR TABLE items")
    spec = BatchSpec(dsn=db.dsn, slot="no_such_slot", plugin="pgoutput",
                     options=tuple(peek_options("pgoutput", publications=["pub_cols"])), upto_nchanges=None,
                     high_water_mark=None, fetch="adbc")
    outcome = BatchOutcome()
    assert list(iter_batch(spec, outcome)) == []
    assert isinstance(outcome.error, SlotNotFoundError), outcome.error

    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    holder = subprocess.Popen(
        [str(pg_recvlogical()), "-d", db.dsn, "--slot", slot, "--start", "--no-loop", "-f", "/dev/null",
         "-o", "proto_version=1", "-o", "publication_names=pub_cols"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        active = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active"
        assert wait_until(lambda: bool(db.execute(active, (slot,))), timeout=20)
        outcome = BatchOutcome()
        assert list(iter_batch(BatchSpec(**{**spec.__dict__, "slot": slot}), outcome)) == []
        assert isinstance(outcome.error, SlotBusyError), outcome.error
        assert db.dsn.split("@")[0].split(":")[-1] not in str(outcome.error)  # no password in the message
    finally:
        holder.terminate()
        holder.wait(timeout=10)


def test_pgpoll_fetch_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(FETCH_ENV, raising=False)
    assert requested_fetch() == "auto"
    assert choose_fetch("pgoutput", "auto") == "adbc"
    assert choose_fetch("test_decoding", "auto") == "adbc"
    assert choose_fetch("pgoutput", "psycopg2") == "psycopg2"
    monkeypatch.setenv(FETCH_ENV, " ADBC ")
    assert requested_fetch() == "adbc"
    monkeypatch.setenv(FETCH_ENV, "fast")
    with pytest.raises(ConfigError, match="PGPOLL_FETCH='fast'"):
        requested_fetch()


def test_a_bad_pgpoll_fetch_is_exit_2_before_anything(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub_cols FOR TABLE items")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO items VALUES (1)")
    position = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s"
    before = db.execute(position, (slot,))
    monkeypatch.setenv(FETCH_ENV, "turbo")
    result = ingest(db.dsn, "--slot", slot, "--publication", "pub_cols", "--output", str(tmp_path / "out"))
    assert result.exit_code == 2 and "PGPOLL_FETCH='turbo'" in result.stderr
    assert not (tmp_path / "out").exists() and db.execute(position, (slot,)) == before
    monkeypatch.setenv(FETCH_ENV, "psycopg2")
    result = ingest(db.dsn, "--slot", slot, "--publication", "pub_cols", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0 and result.summary is not None
    assert result.summary["fetch"] == "psycopg2" and result.summary["changes"] == 1
