"""Snapshot reads against a real server: texts, plans, snapshots, locks, the shared snapshot, the wait."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import threading
import time
from typing import Any

import pytest

from pgpoll.cli.exitcodes import SOURCE, exit_code_for
from pgpoll.errors import LockTimeoutError, SharedSnapshotLostError, SlotNotFoundError, SourceError, TableRewrittenError
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.session import pinned_transaction
from pgpoll.source.snapshot.catalog import CHUNKED, SHARED, SnapshotTable, describe_table, snapshot_tables
from pgpoll.source.snapshot.reads import (
    ChunkSpec,
    SharedSnapshot,
    check_source,
    current_wal_lsn,
    parse_csv,
    plan_chunks,
    read_chunk,
    wait_for_transactions,
)
from pgpoll.table_patterns import TablePatterns


def _table(db: Any, name: str, plugin: str = "test_decoding") -> SnapshotTable:
    conn = connect(resolve_dsn(db.dsn))
    try:
        return describe_table(conn, "public", name, plugin=plugin)
    finally:
        conn.close()


def _read_all(db: Any, t: SnapshotTable, chunk_rows: int, exported: str | None = None) -> list[tuple[Any, ...]]:
    conn = connect(resolve_dsn(db.dsn))
    try:
        chunks = plan_chunks(conn, t, chunk_rows)
    finally:
        conn.close()
    rows: list[tuple[Any, ...]] = []
    for chunk in chunks:
        assert ChunkSpec.from_json(chunk.to_json()) == chunk
        got = read_chunk(db.dsn, t, chunk, lock_timeout_ms=2000, exported=exported)
        rows.extend(tuple(r.values()) for r in got.texts.to_pylist())
    return rows


_VALUES = """
INSERT INTO v VALUES
 (1, NULL, '', 't', 1.5, 0.1, '2020-01-02 03:04:05.678+02', '1 day 02:00', '{"a": [1, "x"]}', '\\x00ff0a22',
  '{"a,b", NULL, "q\\"uote", "back\\\\slash", ""}', '{{1,2},{3,4}}', 'infinity', gen_random_uuid()),
 (2, E'line1\\nline2\\r\\n"quoted", and, commas', '""', 'f', 'NaN', -0.0, '-infinity', '-1 mon', 'null', '\\x',
  '{}', NULL, '2020-02-29', NULL),
 (3, repeat('toast ', 600000), 'NULL', NULL, NULL, 1e300, NULL, NULL, '[]', NULL, '{NULL}', '{}', NULL, NULL),
 (4, E'back\\\\slash \\\\N \\t tab', ',', 't', 123456789.123456789, 3.14, '0001-01-01 00:00:00 BC', NULL, NULL,
  '\\x5c', '{"\\\\N"}', '{5}', '10000-01-01', NULL)
"""


def test_texts_are_the_servers_output_text(db: Any) -> None:
    db.execute("""CREATE TABLE v (id int PRIMARY KEY, t text, e text, b boolean, n numeric, f float8, ts timestamptz,
                  i interval, j jsonb, by bytea, arr text[], ia int[], d date, u uuid)""")
    db.execute("SET TimeZone = 'America/New_York'")  # the database's own settings must not matter
    db.execute("ALTER DATABASE " + db.name + " SET DateStyle = 'German, DMY'")
    db.execute("ALTER DATABASE " + db.name + " SET bytea_output = 'escape'")
    db.execute(_VALUES)
    t = _table(db, "v")
    got = sorted(_read_all(db, t, 2), key=lambda r: int(r[0]))
    conn = connect(resolve_dsn(db.dsn))
    try:
        with pinned_transaction(conn) as cur:  # the output functions' text under the pinned settings
            cur.execute("SELECT " + ", ".join(
                f"CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END" for c in t.names) + " FROM v ORDER BY id")
            expected = [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()
    assert len(got) == 4
    for g, e in zip(got, expected, strict=True):
        assert g == e
    assert got[0][1] is None and got[0][2] == ""  # NULL stays NULL, '' stays ''
    assert got[2][2] == "NULL" and len(got[2][1]) == 3_600_000  # a TOASTed value bigger than pyarrow's default block


def test_parse_csv_edge_cases() -> None:
    data = b'1,,""\n2,"a\nb","x""y"\n3,\\N,"\\"\n'
    table = parse_csv(data, ("k", "a", "b"))
    assert table.to_pylist() == [
        {"k": "1", "a": None, "b": ""},
        {"k": "2", "a": "a\nb", "b": 'x"y'},
        {"k": "3", "a": "\\N", "b": "\\"},
    ]
    assert parse_csv(b"", ("k",)).num_rows == 0 and parse_csv(b"", ("k",)).schema.names == ["k"]


def test_publication_row_filter_and_column_list_are_applied(db: Any) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, x text, secret text)")
    db.execute("INSERT INTO a SELECT g, 'x' || g, 's' FROM generate_series(1, 40) g")
    db.execute("CREATE PUBLICATION p FOR TABLE a (id, x) WHERE (id % 4 = 0)")
    conn = connect(resolve_dsn(db.dsn))
    try:
        (t,) = snapshot_tables(conn, plugin="pgoutput", publications=["p"], patterns=TablePatterns())
    finally:
        conn.close()
    rows = _read_all(db, t, 3)
    assert sorted(int(r[0]) for r in rows) == list(range(4, 41, 4))
    assert all(len(r) == 2 and r[1] == f"x{r[0]}" for r in rows)


@pytest.mark.parametrize("ddl,fill", [
    ("(id bigint PRIMARY KEY, x int, v int)", "SELECT g, g, g FROM generate_series(1, 600) g"),
    ('(a int, b text COLLATE "C", v int, PRIMARY KEY (a, b))',
     "SELECT g % 7, md5(g::text) || '%s %% ''\"', g FROM generate_series(1, 600) g"),
    ("(z bytea, u uuid, v int, PRIMARY KEY (z, u))",
     "SELECT decode(lpad(to_hex(g % 5), 2, '0'), 'hex'), gen_random_uuid(), g FROM generate_series(1, 600) g"),
])
def test_key_ranges_cover_every_row_exactly_once(db: Any, ddl: str, fill: str) -> None:
    # no autovacuum: an ANALYZE between the insert and the plan would cut at the histogram (about 50 rows a
    # chunk) instead of probing (exactly 50), which this test pins
    db.execute(f"CREATE TABLE k {ddl} WITH (autovacuum_enabled = off)")
    db.execute(f"INSERT INTO k {fill}")
    t = _table(db, "k")
    assert t.mode == CHUNKED
    conn = connect(resolve_dsn(db.dsn))
    try:
        chunks = plan_chunks(conn, t, 50)
    finally:
        conn.close()
    assert len(chunks) in (12, 13) and chunks[0].lo is None and chunks[-1].hi is None
    assert all(c.lo == p.hi for p, c in itertools.pairwise(chunks))
    sizes = [read_chunk(db.dsn, t, c, lock_timeout_ms=2000).texts.num_rows for c in chunks]
    assert sizes[:12] == [50] * 12 and sum(sizes) == 600  # boundaries in the key's own order, every 50 rows
    rows = _read_all(db, t, 50)
    assert sorted(int(r[2]) for r in rows) == list(range(1, 601))


@pytest.mark.parametrize("ddl,fill", [
    ("(id bigint PRIMARY KEY, v int)", "SELECT g * 3, g FROM generate_series(1, 20000) g"),  # histogram, cut finer
    ('(id text COLLATE "C" PRIMARY KEY, v int)', "SELECT md5(g::text), g FROM generate_series(1, 20000) g"),  # histogram
    ("(a int, b uuid, v int, PRIMARY KEY (a, b))", "SELECT g % 13, gen_random_uuid(), g FROM generate_series(1, 20000) g"),
])
def test_large_tables_are_cut_at_their_statistics_into_ranges_that_cover_every_row(db: Any, ddl: str, fill: str) -> None:
    """No probe per chunk: the key's histogram (one column) or a block sample (composite keys) gives the bounds."""
    db.execute(f"CREATE TABLE big {ddl}")
    db.execute(f"INSERT INTO big {fill}")
    db.execute("ANALYZE big")
    t = _table(db, "big")
    conn = connect(resolve_dsn(db.dsn))
    try:
        chunks = plan_chunks(conn, t, 500)
    finally:
        conn.close()
    assert 25 <= len(chunks) <= 45 and chunks[0].lo is None and chunks[-1].hi is None
    assert all(c.lo == p.hi for p, c in itertools.pairwise(chunks))
    sizes = [read_chunk(db.dsn, t, c, lock_timeout_ms=2000).texts.num_rows for c in chunks]
    assert sum(sizes) == 20000 and max(sizes) < 1500  # about 500 each


def test_a_chunk_records_the_snapshot_its_rows_were_read_under(db: Any) -> None:
    db.execute("CREATE TABLE s (id int PRIMARY KEY)")
    db.execute("INSERT INTO s VALUES (1)")
    writer = db.connect(autocommit=False)
    with writer.cursor() as cur:
        cur.execute("INSERT INTO s VALUES (2)")
        cur.execute("SELECT pg_current_xact_id()::text")
        xid = int(cur.fetchone()[0])
    db.execute("INSERT INTO s VALUES (3)")  # a later transaction ends: the writer's id falls below xmax
    t = _table(db, "s")
    got = read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=1000)
    writer.commit()
    assert [r["id"] for r in got.texts.to_pylist()] == ["1", "3"]
    assert xid in got.snapshot.xip and not got.snapshot.visible(xid)
    assert got.relfilenode == t.relfilenode > 0
    db.execute("TRUNCATE s")
    assert read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=1000).relfilenode != t.relfilenode


def test_the_lock_comes_before_the_snapshot(db: Any) -> None:
    """A TRUNCATE holding its lock when the read starts: the read waits, then sees the empty table (not the old rows)."""
    db.execute("CREATE TABLE r (id int PRIMARY KEY)")
    db.execute("INSERT INTO r SELECT generate_series(1, 10)")
    t = _table(db, "r")
    truncator = db.connect(autocommit=False)
    with truncator.cursor() as cur:
        cur.execute("TRUNCATE r")
    timer = threading.Timer(0.7, truncator.commit)
    timer.start()
    try:
        got = read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=10_000)
    finally:
        timer.join()
    assert got.texts.num_rows == 0


def test_a_lock_timeout_names_the_blocker(db: Any) -> None:
    db.execute("CREATE TABLE l (id int PRIMARY KEY)")
    t = _table(db, "l")
    blocker = db.connect(autocommit=False, application_name="blocker-app")
    with blocker.cursor() as cur:
        cur.execute("LOCK TABLE l IN ACCESS EXCLUSIVE MODE")
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as caught:
            read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=300)
        assert time.monotonic() - started < 5
        with pytest.raises(LockTimeoutError):
            SharedSnapshot(db.dsn, t, 10, lock_timeout_ms=300).__enter__()
    finally:
        blocker.rollback()
    err = caught.value
    assert (err.blocker_pid, err.blocker_application, err.table) == (blocker.get_backend_pid(), "blocker-app", "public.l")
    assert "blocker-app" in str(err) and str(blocker.get_backend_pid()) in str(err) and "--lock-timeout" in str(err)
    assert exit_code_for(err) == SOURCE
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is LockTimeoutError and again.blocker_pid == err.blocker_pid


def test_shared_snapshot_chunks_read_one_state_under_concurrent_writes(db: Any) -> None:
    db.execute("CREATE TABLE sh (id numeric PRIMARY KEY, v text)")
    db.execute("INSERT INTO sh SELECT g, repeat('v', 100) FROM generate_series(1, 3000) g")
    db.execute("ANALYZE sh")
    t = _table(db, "sh")
    assert t.mode == SHARED
    with SharedSnapshot(db.dsn, t, 60) as shared:
        expected = sorted((str(i), "v" * 100) for i in range(1, 3001))
        db.execute("UPDATE sh SET v = 'changed' WHERE id % 2 = 0")
        db.execute("DELETE FROM sh WHERE id % 3 = 0")
        db.execute("INSERT INTO sh SELECT g, 'new' FROM generate_series(3001, 6000) g")
        conn = connect(resolve_dsn(db.dsn))
        try:
            chunks = plan_chunks(conn, t, 500)
        finally:
            conn.close()
        assert len(chunks) >= 6 and chunks[-1].blocks is not None and chunks[-1].blocks[1] is None
        rows: list[tuple[Any, ...]] = []
        for chunk in chunks:
            got = read_chunk(db.dsn, t, chunk, lock_timeout_ms=2000, exported=shared.exported)
            assert got.snapshot == shared.snapshot
            rows.extend(tuple(r.values()) for r in got.texts.to_pylist())
        assert sorted(rows) == expected
    with pytest.raises(SharedSnapshotLostError):  # closed means closed: SharedSnapshot.close() ends the transaction
        read_chunk(db.dsn, t, chunks[0], lock_timeout_ms=2000, exported=shared.exported)


def test_a_closed_shared_snapshot_cannot_be_imported_while_its_backend_lags(db: Any) -> None:
    """The exporter's backend is stopped (SIGSTOP: a busy machine, played deterministically) when the snapshot is closed.

    Closing the connection alone returns at once and leaves the transaction
    open until the backend reads the client's goodbye, so a chunk read in
    between imported the snapshot; close() now waits for the server to end
    the transaction. The backend resumes after a second whatever happens.
    """
    db.execute("CREATE TABLE lag (id numeric PRIMARY KEY)")
    t = _table(db, "lag")
    shared = SharedSnapshot(db.dsn, t, 60).__enter__()
    pid = shared._conn.get_backend_pid()
    try:
        os.kill(pid, signal.SIGSTOP)
    except PermissionError:
        shared.close()
        pytest.skip("the server's processes belong to another user: cannot stop its backend")
    resume = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        shared.close()
        with pytest.raises(SharedSnapshotLostError):
            read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=2000, exported=shared.exported)
    finally:
        resume.join()


def test_the_exporter_ends_itself_after_its_timeout(db: Any) -> None:
    db.execute("CREATE TABLE ex (id numeric PRIMARY KEY)")
    t = _table(db, "ex")
    with SharedSnapshot(db.dsn, t, 0.4) as shared:
        time.sleep(1.0)  # idle_in_transaction_session_timeout ends the exporting session (and its xmin)
        with pytest.raises(SharedSnapshotLostError, match="shared-snapshot-timeout"):
            read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=1000, exported=shared.exported)


def test_shared_partitioned_table_reads_each_leaf(db: Any) -> None:
    db.execute("""CREATE TABLE pm (id numeric, k int, PRIMARY KEY (id, k)) PARTITION BY LIST (k);
                  CREATE TABLE pm1 PARTITION OF pm FOR VALUES IN (1); CREATE TABLE pm2 PARTITION OF pm FOR VALUES IN (2);
                  INSERT INTO pm SELECT g, 1 + g % 2 FROM generate_series(1, 100) g;
                  CREATE PUBLICATION p FOR TABLE pm WITH (publish_via_partition_root = true)""")
    conn = connect(resolve_dsn(db.dsn))
    try:
        (t,) = snapshot_tables(conn, plugin="pgoutput", publications=["p"], patterns=TablePatterns())
        assert t.mode == SHARED and t.partitioned
        chunks = plan_chunks(conn, t, 1000)
    finally:
        conn.close()
    assert [c.relation for c in chunks] == [("public", "pm1"), ("public", "pm2")]
    with SharedSnapshot(db.dsn, t, 60) as shared:
        rows = [r for c in chunks for r in read_chunk(db.dsn, t, c, lock_timeout_ms=2000,
                                                       exported=shared.exported).texts.to_pylist()]
    assert sorted(int(r["id"]) for r in rows) == list(range(1, 101))


def test_wait_for_transactions_waits_for_an_open_transaction(db: Any) -> None:
    db.execute("CREATE TABLE w (id int)")
    writer = db.connect(autocommit=False)
    with writer.cursor() as cur:
        cur.execute("INSERT INTO w VALUES (1)")
        cur.execute("SELECT pg_current_xact_id()::text")
        xid = int(cur.fetchone()[0])
    conn = connect(resolve_dsn(db.dsn))
    try:
        with pytest.raises(SourceError, match=str(xid)):
            wait_for_transactions(conn, [xid], 0.3)
        before = current_wal_lsn(conn)
        timer = threading.Timer(0.8, writer.commit)
        started = time.monotonic()
        timer.start()
        lsn = wait_for_transactions(conn, [xid, xid], 10)
        timer.join()
        assert time.monotonic() - started >= 0.7
        assert lsn > before  # past the commit record
        assert wait_for_transactions(conn, [], 1) >= lsn
    finally:
        conn.close()


def test_check_source(db: Any) -> None:
    db.execute("SELECT pg_create_logical_replication_slot('snap_ok', 'pgoutput')")
    conn = connect(resolve_dsn(db.dsn))
    try:
        check = check_source(conn, "snap_ok")
        assert check.plugin == "pgoutput" and check.server_version >= 150000
        with pytest.raises(SlotNotFoundError):
            check_source(conn, "absent")
    finally:
        conn.close()


def test_the_exporter_does_not_hold_its_lock_and_a_rewrite_is_noticed(db: Any) -> None:
    """The application's TRUNCATE is not queued behind an open shared snapshot; a chunk read after it is refused."""
    db.execute("CREATE TABLE tr (id numeric PRIMARY KEY)")
    db.execute("INSERT INTO tr SELECT generate_series(1, 20)")
    t = _table(db, "tr")
    with SharedSnapshot(db.dsn, t, 60) as shared:
        got = read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=2000, exported=shared.exported,
                         exported_relfilenode=shared.relfilenode)
        assert got.texts.num_rows == 20 and got.relfilenode == shared.relfilenode
        truncator = db.connect()
        with truncator.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")
            cur.execute("TRUNCATE tr")  # a lock held by the exporter would time this out
        with pytest.raises(TableRewrittenError, match="rewritten"):
            read_chunk(db.dsn, t, ChunkSpec(0), lock_timeout_ms=2000, exported=shared.exported,
                       exported_relfilenode=shared.relfilenode)
