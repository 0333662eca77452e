"""The pure parts of a chunked snapshot: which mode and why, how big a chunk, when a recheck is needed, progress."""

from __future__ import annotations

from typing import Any

from pgpoll.sink.snapshot_store import RECHECK_FIRST, chunk_file
from pgpoll.snapshot import recheck
from pgpoll.snapshot.progress import Counts
from pgpoll.source.snapshot.chunks import MIN_CHUNK_ROWS, READ_BYTES_PER_S, ChunkSpec, chunk_rows_for
from pgpoll.source.snapshot.modes import CHUNKED, SHARED, choose_mode


def test_modes_and_why() -> None:
    assert choose_mode(("id",), "d", []) == (CHUNKED, "key (id) orders alike in PostgreSQL and Spark: one short "
                                                      "snapshot per chunk")
    assert choose_mode(("id",), "d", [], requested="shared") == (SHARED, "--mode shared")
    mode, why = choose_mode((), "f", [])
    assert mode == SHARED and "REPLICA IDENTITY FULL" in why
    mode, why = choose_mode(("k",), "d", ["k (numeric)"])
    assert mode == SHARED and "k (numeric)" in why and "only the server knows" in why
    assert choose_mode((), "n", [])[0] == SHARED


def test_a_chunk_is_bounded_by_rows_and_by_the_time_its_bytes_take() -> None:
    assert chunk_rows_for(100_000, 2.0, None) == 100_000  # row size unknown (never analyzed)
    assert chunk_rows_for(100_000, 2.0, 100.0) == 100_000  # narrow rows: the row bound
    wide = chunk_rows_for(100_000, 2.0, 20_000.0)  # 20 kB rows (TOAST): 2 s of them
    assert wide == int(2.0 * READ_BYTES_PER_S / 20_000.0) < 100_000
    assert chunk_rows_for(100_000, 0.1, 10_000_000.0) == MIN_CHUNK_ROWS
    assert chunk_rows_for(10, 2.0, 10_000_000.0) == 10  # never more rows than asked for


def _manifest(xmin: int, xmax: int, xip: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"snapshot": {"xmin": xmin, "xmax": xmax, "xip": list(xip)}}


def test_a_recheck_follows_the_oldest_xmin_and_is_skipped_when_no_transaction_ran_between_the_chunks() -> None:
    quiet = {0: _manifest(100, 100), 1: _manifest(100, 100), 2: _manifest(100, 100)}
    assert recheck.since(quiet) == 100 and not recheck.needed(quiet)
    busy = {0: _manifest(100, 100), 1: _manifest(103, 105, (103,)), RECHECK_FIRST: _manifest(90, 200)}
    assert recheck.since(busy) == 100 and recheck.needed(busy)  # (a recheck piece's own snapshot does not count)
    running = {0: _manifest(98, 100, (98,)), 1: _manifest(98, 100, (98,))}
    assert recheck.needed(running)  # transaction 98 may commit a move between the chunks
    pieces = recheck.numbered([ChunkSpec(0, relation=("public", "t"), blocks=(0, 8)),
                               ChunkSpec(1, relation=("public", "t"), blocks=(8, None))])
    assert [p.n for p in pieces] == [RECHECK_FIRST, RECHECK_FIRST + 1] and pieces[1].blocks == (8, None)
    assert chunk_file(3) == "chunk=3/part-00000.parquet"
    assert chunk_file(RECHECK_FIRST).startswith("_recheck/")  # out of sight of a plain read of the table's rows


def test_progress_says_rows_chunks_rate_and_time_left() -> None:
    line = Counts(chunks=12, total=20, rows=1_200_000, rows_before=0, chunks_before=0, seconds=4.0).line()
    assert line == "snapshot: 1,200,000 rows, 12/20 chunks, 300,000 rows/s, about 3 s left"
    resumed = Counts(chunks=15, total=20, rows=1_500_000, rows_before=1_000_000, chunks_before=10, seconds=600.0)
    assert resumed.line().endswith("833 rows/s, about 10 min left")
    checking = Counts(chunks=20, total=20, rows=2_000_000, rows_before=0, chunks_before=0, seconds=10.0,
                      pieces=1, pieces_total=3)
    assert checking.line() == "snapshot: 2,000,000 rows, 20/20 chunks, 200,000 rows/s, recheck 1/3"
