"""``spark.readStream.format("pgpoll")`` in this process's Spark: batches, admission control, the slot's checks.

The kills are in ``test_stream_kills.py``; here each query runs with
``trigger(availableNow=True)`` to the end, and what it did is looked at
batch by batch through a ``foreachBatch`` that keeps each batch's rows.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pgpoll.spark
from pgpoll.lsn import Lsn
from pgpoll.spark.registration import spark_version, supported


@pytest.fixture
def pg(spark: Any) -> Any:
    pgpoll.spark.register(spark)
    return spark


def make_slot(db: Any, plugin: str) -> str:
    db.require_plugin(plugin)
    db.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE IF NOT EXISTS other (id int PRIMARY KEY)")
    if not db.execute("SELECT 1 FROM pg_publication WHERE pubname = 'pub'"):
        db.execute("CREATE PUBLICATION pub FOR TABLE items")
    slot: str = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    return slot


def stream(spark: Any, db: Any, slot: str, plugin: str, **options: Any) -> Any:
    reader = spark.readStream.format("pgpoll").option("slot", slot).option("dsn", db.dsn)
    if plugin == "pgoutput":
        reader = reader.option("publication", "pub")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def run_batches(frame: Any, checkpoint: Path) -> list[list[dict[str, Any]]]:
    """Run ``frame`` with availableNow; each batch's rows (commit_lsn, seq, op, after id), in batch order."""
    batches: list[list[dict[str, Any]]] = []

    def keep(batch: Any, _batch_id: int) -> None:
        batches.append([r.asDict() for r in batch.select("commit_lsn", "seq", "op", "after").collect()])

    query = frame.writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return batches


def write_transactions(db: Any, sizes: list[int], first: int = 1) -> int:
    for size in sizes:
        db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s, %s) g", (first, first + size - 1))
        first += size
    return first


def confirmed(db: Any, slot: str) -> Lsn:
    return Lsn.parse(db.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                (slot,))[0][0])


def expect_failure(run: Callable[[], Any], *needles: str) -> str:
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as failed:
        run()
    text = str(failed.value)
    for needle in needles:
        assert needle in text, text[-3000:]
    return text


# --- batches and admission control -----------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_max_rows_bounds_each_batch_and_a_larger_transaction_passes_whole(pg: Any, db: Any, tmp_path: Path,
                                                                         plugin: str) -> None:
    slot = make_slot(db, plugin)
    sizes = [60] * 8 + [700] + [60] * 6 + [1] * 30
    write_transactions(db, sizes)
    db.execute("ANALYZE items")  # a transaction without a row: test_decoding prints it (BEGIN, COMMIT), pgoutput not
    last_boundary = boundaries(db, slot, plugin)[-1]
    batches = run_batches(stream(pg, db, slot, plugin, maxRowsPerTrigger=250), tmp_path / "ck")
    rows = [r for b in batches for r in b]
    assert len(rows) == sum(sizes) and len({(r["commit_lsn"], r["seq"]) for r in rows}) == len(rows)
    assert sorted(int(r["after"]["id"]) for r in rows) == list(range(1, sum(sizes) + 1))
    for batch in batches:
        transactions = {r["commit_lsn"] for r in batch}
        assert len(batch) <= 250 or len(transactions) == 1, (len(batch), len(transactions))
    # as many whole transactions as fit in 250 rows; the 700-row one alone and whole
    assert [len(b) for b in batches if b] == [240, 240, 700, 240, 150]
    # batches follow each other: every commit LSN of a batch is above the previous batch's
    ends = [max(r["commit_lsn"] for r in b) for b in batches if b]
    starts = [min(r["commit_lsn"] for r in b) for b in batches if b]
    assert all(s > e for s, e in zip(starts[1:], ends, strict=False))
    # the run's last latestOffset moved the slot to its last end: the last boundary, the empty transaction's for
    # test_decoding (its batch ends there, with no row of it)
    assert confirmed(db, slot) == last_boundary
    assert (last_boundary > Lsn(ends[-1])) if plugin == "test_decoding" else (last_boundary == Lsn(ends[-1]))


def test_max_bytes_bounds_each_batch_by_the_plugins_output(pg: Any, db: Any, tmp_path: Path) -> None:
    slot = make_slot(db, "test_decoding")
    write_transactions(db, [40, 30, 20, 40, 10, 40, 5, 40, 40, 1])
    sizes: list[int] = []  # each transaction's changes as test_decoding prints them: what the limit counts
    for (data,) in db.execute("SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, 'include-xids', '1', "
                              "'include-timestamp', '1')", (slot,)):
        if data.startswith("BEGIN"):
            sizes.append(0)
        elif data.startswith("table "):
            sizes[-1] += len(data.encode())
    limit = 2 * max(sizes) + 100
    expected: list[int] = []  # greedy, as admission control cuts: whole transactions while they fit
    total = limit + 1
    for size in sizes:
        if total + size > limit:
            expected.append(0)
            total = 0
        expected[-1] += 1
        total += size
    batches = run_batches(stream(pg, db, slot, "test_decoding", maxBytesPerTrigger=limit), tmp_path / "ck")
    assert [len({r["commit_lsn"] for r in b}) for b in batches if b] == expected
    assert len(expected) >= 3


def test_a_second_run_reads_only_what_is_new_and_an_idle_run_makes_no_batch(pg: Any, db: Any, tmp_path: Path) -> None:
    slot = make_slot(db, "pgoutput")
    following = write_transactions(db, [10, 10])
    assert sum(len(b) for b in run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")) == 20
    # The server's own records count as WAL after the slot: the running-xacts snapshot the background writer logs
    # within 15 s of the first run's end message gets the next run one batch, empty.
    wait_for_standby_snapshot(db, slot)
    assert run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck") == [[]]
    # Nothing in the WAL after the slot: no batch. The next snapshot is due 15 s after that one at the earliest;
    # should it come during the run all the same, the run makes one batch, and it must be empty.
    flushed = db.execute("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    batches = run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")
    idle = db.execute("SELECT pg_current_wal_flush_lsn()::text")[0][0] == flushed
    assert batches == [] if idle else batches in ([], [[]]), (idle, batches)
    db.execute("INSERT INTO other VALUES (1)")  # not published: no row (one empty batch, its end found without a decode)
    assert sum(len(b) for b in run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")) == 0
    write_transactions(db, [5], following)
    assert [len(b) for b in run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")] == [5]


def wait_for_standby_snapshot(db: Any, slot: str, timeout_s: float = 30.0) -> None:
    """Wait until WAL was written after the slot's position: on a server nobody writes to, the background
    writer's snapshot of running transactions, due within 15 s of the last WAL written."""
    deadline = time.monotonic() + timeout_s
    while not db.execute("SELECT pg_current_wal_flush_lsn() > confirmed_flush_lsn FROM pg_replication_slots "
                         "WHERE slot_name = %s", (slot,))[0][0]:
        assert time.monotonic() < deadline, "no WAL after the slot's position within the timeout"
        time.sleep(0.2)


def peek_lsns(db: Any, slot: str, plugin: str, *, pgoutput_where: str, test_decoding_where: str) -> list[Lsn]:
    """The lsn of each row of a plain peek of ``slot`` that the plugin's condition keeps, in order."""
    if plugin == "pgoutput":
        query = ("SELECT lsn::text FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                 f"'publication_names', 'pub', 'messages', 'true') WHERE {pgoutput_where}")
    else:
        query = f"SELECT lsn::text FROM pg_logical_slot_peek_changes(%s, NULL, NULL) WHERE {test_decoding_where}"
    return [Lsn.parse(r[0]) for r in db.execute(query, (slot,))]


def boundaries(db: Any, slot: str, plugin: str) -> list[Lsn]:
    """The lsn of each COMMIT row a peek of ``slot`` returns, in order."""
    return peek_lsns(db, slot, plugin, pgoutput_where="get_byte(data, 0) = 67",
                     test_decoding_where="data LIKE 'COMMIT%%'")


def heartbeat_messages(db: Any, slot: str, plugin: str) -> list[Lsn]:
    """The lsn of each non-transactional ``pgpoll.heartbeat`` message a peek of ``slot`` returns."""
    return peek_lsns(db, slot, plugin,
                     pgoutput_where="get_byte(data, 0) = 77 AND get_byte(data, 1) = 0 "
                                    "AND position('pgpoll.heartbeat'::bytea IN data) > 0",
                     test_decoding_where="data LIKE 'message: transactional: 0 prefix: pgpoll.heartbeat,%%'")


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_without_limits_a_run_ends_at_a_message_it_wrote_and_finds_it_without_a_decode(pg: Any, db: Any,
                                                                                       tmp_path: Path,
                                                                                       plugin: str) -> None:
    from pgpoll.spark.source_options import parse_options
    from pgpoll.spark.stream_offsets import StreamOffsets

    slot, twin, direct = make_slot(db, plugin), make_slot(db, plugin), make_slot(db, plugin)
    sizes = [10, 300, 1, 40]
    write_transactions(db, sizes)
    # the driver's side alone, in this process: the run's end is a message's lsn, and no decode finds it
    options = {"slot": direct, "dsn": db.dsn, **({"publication": "pub"} if plugin == "pgoutput" else {})}
    offsets = StreamOffsets(parse_options(options, streaming=True))
    try:
        start = offsets.initial()
        offsets.prepare_available_now()
        assert offsets.cap_is_boundary and offsets.cap is not None
        assert offsets.latest(start, None, None) == offsets.cap
        assert offsets.latest(offsets.cap, None, None) == offsets.cap  # the run's last call: nothing new
        assert offsets.decodes == 0 and offsets.last is None
        assert heartbeat_messages(db, twin, plugin) == [offsets.cap]  # the message row's lsn is the returned one
        assert confirmed(db, direct) == offsets.cap
    finally:
        offsets.stop()
    # through Spark: one batch, every change once, the slot at that batch's end: the run's own message
    batches = run_batches(stream(pg, db, slot, plugin), tmp_path / "ck")
    rows = [r for b in batches for r in b]
    assert [len(b) for b in batches] == [sum(sizes)]
    assert sorted(int(r["after"]["id"]) for r in rows) == list(range(1, sum(sizes) + 1))
    messages = heartbeat_messages(db, twin, plugin)
    assert len(messages) == 2 and confirmed(db, slot) == messages[1] > max(Lsn(r["commit_lsn"]) for r in rows)


def test_with_a_limit_each_batch_end_is_found_by_a_decode_capped_at_the_flush_position(db: Any) -> None:
    from pgpoll.spark.source_options import parse_options
    from pgpoll.spark.stream_offsets import StreamOffsets

    slot, twin = make_slot(db, "test_decoding"), make_slot(db, "test_decoding")
    write_transactions(db, [10, 10])
    offsets = StreamOffsets(parse_options({"slot": slot, "dsn": db.dsn, "maxRowsPerTrigger": "10"}, streaming=True))
    try:
        start = offsets.initial()
        offsets.prepare_available_now()
        cap = offsets.cap
        assert cap is not None and not offsets.cap_is_boundary and heartbeat_messages(db, twin, "test_decoding") == []
        end = offsets.latest(start, 10, None)
        assert offsets.decodes == 1 and offsets.last is not None and offsets.last.changes == 10 and end < cap
    finally:
        offsets.stop()


# --- the slot moved under the query: an error, never a silent skip ---------------------------------------------------


def test_a_slot_advanced_by_someone_else_fails_the_query(pg: Any, db: Any, tmp_path: Path) -> None:
    slot = make_slot(db, "pgoutput")
    following = write_transactions(db, [10])
    run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")
    write_transactions(db, [10, 10], following)
    db.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))  # another consumer
    expect_failure(lambda: run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck"),
                   "SlotMovedError", "past", "fix:")


def test_an_older_checkpoint_than_the_slot_fails_the_query(pg: Any, db: Any, tmp_path: Path) -> None:
    slot = make_slot(db, "test_decoding")
    following = write_transactions(db, [10])
    run_batches(stream(pg, db, slot, "test_decoding"), tmp_path / "ck")
    shutil.copytree(tmp_path / "ck", tmp_path / "ck-saved")
    write_transactions(db, [10], following)
    run_batches(stream(pg, db, slot, "test_decoding"), tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck")
    shutil.copytree(tmp_path / "ck-saved", tmp_path / "ck")  # a lost checkpoint, restored from an older copy
    expect_failure(lambda: run_batches(stream(pg, db, slot, "test_decoding"), tmp_path / "ck"), "SlotMovedError")


def test_a_batch_rerun_after_the_slot_moved_fails_in_its_task(pg: Any, db: Any, tmp_path: Path) -> None:
    """A restart re-runs a batch not in ``commits/`` from its logged offsets, without latestOffset: the task checks."""
    slot = make_slot(db, "pgoutput")
    write_transactions(db, [10, 10])
    assert len(run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck")) == 1
    for name in ("0", ".0.crc"):  # batch 0 planned, not committed: a restart runs it again
        (tmp_path / "ck" / "commits" / name).unlink()
    text = expect_failure(lambda: run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck"), "SlotMovedError")
    assert "slot_reads.py" in text  # raised by the batch's read, in its task


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_a_batch_that_stops_short_of_its_end_fails_in_its_task(db: Any, plugin: str) -> None:
    """The task's exactness check: its peek must reach the batch's end, a COMMIT's or a message's lsn, exactly."""
    from pgpoll.errors import SourceError
    from pgpoll.source.commit_boundaries import mark_boundary, wait_flushed
    from pgpoll.source.slots import peek_options
    from pgpoll.spark.slot_reads import SlotRead, read_slot

    slot = make_slot(db, plugin)
    start = confirmed(db, slot)
    write_transactions(db, [10])
    conn = db.connect()
    end = mark_boundary(conn, "{}")
    wait_flushed(conn, end)
    options = tuple(peek_options(plugin, publications=["pub"]))
    exact = list(read_slot(SlotRead(db.dsn, slot, plugin, options, int(start), int(end))))
    assert sum(b.num_rows for b in exact) == 10  # ends at the message: accepted, and the message is no row
    with pytest.raises(SourceError, match="ended at"):
        list(read_slot(SlotRead(db.dsn, slot, plugin, options, int(start), int(end) + 8)))  # past what the slot holds


# --- rows ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_messages_truncates_and_heartbeats_come_out_as_ingest_writes_them(pg: Any, db: Any, tmp_path: Path,
                                                                         plugin: str) -> None:
    from pgpoll.reader import read_changes
    from tests.ingest.conftest import ingest

    slot = make_slot(db, plugin)
    twin = make_slot(db, plugin)
    db.execute("INSERT INTO items VALUES (1, 'a'), (2, NULL)")
    db.execute("BEGIN; UPDATE items SET v = 'b' WHERE id = 1; SELECT pg_logical_emit_message(true, 'app', 'in'); COMMIT")
    db.execute("SELECT pg_logical_emit_message(false, 'app', 'alone')")
    db.execute("SELECT pg_logical_emit_message(true, 'pgpoll.heartbeat', '{}')")  # pgpoll's own: never a row
    db.execute("TRUNCATE items")
    db.execute("INSERT INTO items VALUES (3, 'c')")
    pub = ["--publication", "pub"] if plugin == "pgoutput" else []
    result = ingest(db.dsn, "--slot", twin, "--output", str(tmp_path / "out"), *pub)
    assert result.exit_code == 0, result.stderr
    expected = read_changes(pg, str(tmp_path / "out")).drop("lsn_range", "xid").orderBy("commit_lsn", "seq").collect()
    query = (stream(pg, db, slot, plugin).writeStream.format("parquet").option("path", str(tmp_path / "sink"))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    got = pg.read.parquet(str(tmp_path / "sink")).drop("xid").orderBy("commit_lsn", "seq").collect()
    assert [r.op for r in got] == ["I", "I", "U", "M", "M", "T", "I"]
    assert got == expected
    assert pg.read.parquet(str(tmp_path / "sink")).schema == read_changes(pg, str(tmp_path / "out")).drop("lsn_range").schema


def test_a_lagging_slot_with_nothing_published_gets_a_heartbeat(pg: Any, db: Any, tmp_path: Path) -> None:
    slot = make_slot(db, "pgoutput")
    db.execute("CREATE TABLE filler (x text)")
    db.execute("INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 20000)")  # ~20 MB, unpublished
    before = confirmed(db, slot)
    assert run_batches(stream(pg, db, slot, "pgoutput"), tmp_path / "ck") == [[]]  # one batch: the heartbeat's
    lag = db.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (slot,))[0][0]
    assert confirmed(db, slot) > before and lag < 1 << 20


def test_one_tables_typed_rows_match_the_typed_tables_ingest_writes(pg: Any, db: Any, tmp_path: Path) -> None:
    from tests.ingest.conftest import ingest

    slot = make_slot(db, "pgoutput")
    twin = make_slot(db, "pgoutput")
    db.execute("ALTER TABLE items ADD COLUMN n numeric(8,2), ADD COLUMN at timestamptz, ADD COLUMN tags text[]")
    db.execute("INSERT INTO items VALUES (1, 'a', 1.5, '2024-01-01 10:00+00', '{x,y}'), (2, NULL, 'NaN', NULL, NULL)")
    db.execute("UPDATE items SET n = 2.25 WHERE id = 1")
    db.execute("DELETE FROM items WHERE id = 2")
    result = ingest(db.dsn, "--slot", twin, "--output", str(tmp_path / "out"), "--publication", "pub", "--typed-tables")
    assert result.exit_code == 0, result.stderr
    expected = (pg.read.option("mergeSchema", "true").parquet(str(tmp_path / "out" / "tables" / "public.items"))
                .drop("lsn_range").orderBy("_commit_lsn", "_seq"))
    frame = stream(pg, db, slot, "pgoutput", table="public.items")
    batches: list[Any] = []
    query = frame.writeStream.foreachBatch(lambda b, _i: batches.extend(b.collect())).option(
        "checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    query.awaitTermination()
    assert frame.schema == expected.schema
    assert sorted(batches, key=lambda r: (r._commit_lsn, r._seq)) == expected.collect()
    assert [r._op for r in expected.collect()] == ["I", "I", "U", "D"]


# --- registration and secrets ----------------------------------------------------------------------------------------


def test_registration_needs_spark_4_2() -> None:
    assert spark_version("4.1.1") == (4, 1) and not supported("4.1.1") and not supported("3.5.3")
    assert supported("4.2.0") and supported("4.3.0-SNAPSHOT") and supported("5.0.0")


def test_a_spark_below_4_2_is_refused_by_name() -> None:
    from pgpoll.errors import ConfigError
    from pgpoll.spark.registration import check_versions

    with pytest.raises(ConfigError, match=r"needs Spark 4\.2 or newer; this Spark is 4\.1\.1"):
        check_versions("4.1.1", "4.3.0")
    with pytest.raises(ConfigError, match=r"this PySpark is 4\.0\.0") as refused:
        check_versions("4.3.0", "4.0.0")
    assert "pgpoll ingest" in str(refused.value)
    check_versions("4.2.0", "4.3.0")


def test_sparks_own_lookup_finds_the_source() -> None:
    """Spark registers ``DefaultSource`` of every top-level ``pyspark_*`` module (``lookup_data_sources.py``)."""
    import pkgutil

    import pyspark_pgpoll
    from pgpoll.spark.data_source import PgpollDataSource

    assert "pyspark_pgpoll" in {m.name for m in pkgutil.iter_modules()}
    assert pyspark_pgpoll.DefaultSource is PgpollDataSource and PgpollDataSource.name() == "pgpoll"


def test_registration_widens_the_option_redaction_to_the_dsn() -> None:
    from pgpoll.spark.registration import redaction_pattern

    assert redaction_pattern("(?i)url") == "(?i)url|(?i:dsn)"
    assert redaction_pattern("(?i)url|dsn") == "(?i)url|dsn"
    assert redaction_pattern("") == "(?i:dsn)"


def test_the_dsn_shows_in_no_plan_progress_or_partition(pg: Any, db: Any, tmp_path: Path, capsys: Any) -> None:
    slot = make_slot(db, "pgoutput")
    write_transactions(db, [3])
    import psycopg2.extensions

    password = psycopg2.extensions.parse_dsn(db.dsn).get("password")
    assert password and len(password) > 8
    frame = stream(pg, db, slot, "pgoutput")
    frame.explain(True)
    query = frame.writeStream.format("memory").queryName("dsn_check").option(
        "checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    query.awaitTermination()
    query.explain(True)
    preview = pg.read.format("pgpoll").option("slot", slot).option("dsn", db.dsn).option("publication", "pub").load()
    preview.explain("formatted")
    shown = capsys.readouterr().out + str(query.lastProgress) + str(query.recentProgress)
    assert "pgpoll" in shown or "Python" in shown
    assert password not in shown
    from pgpoll.spark.data_source import PartitionOf
    from pgpoll.spark.slot_reads import SlotRead

    assert password not in repr(PartitionOf(SlotRead(db.dsn, slot, "pgoutput", (), 1, 2)))
