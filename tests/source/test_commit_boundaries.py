"""The next batch's end, found on the server: held to the COMMIT rows of a plain peek (the server is the oracle)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pgpoll.lsn import Lsn
from pgpoll.source import slots
from pgpoll.source.commit_boundaries import next_boundary
from pgpoll.source.connection import connect, resolve_dsn

SIZES = (3, 1, 40, 2, 7, 1, 25, 4)  # rows per transaction


@pytest.fixture
def conn(db: Any) -> Iterator[Any]:
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


def _setup(db: Any, conn: Any, plugin: str) -> tuple[str, list[str]]:
    db.require_plugin(plugin)
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION p FOR TABLE t")
    slot = db.slot_name()
    slots.create_slot(conn, slot, plugin)
    first = 0
    for size in SIZES:
        db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s, %s) g", (first, first + size - 1))
        first += size
    db.execute("INSERT INTO other VALUES (1)")  # test_decoding: a boundary with no change of t
    db.execute("SELECT pg_logical_emit_message(false, 'app', 'hello')")  # a non-transactional message: a boundary
    db.execute("INSERT INTO t VALUES (-1, 'last')")  # flushes the message (it is not flushed by itself)
    return slot, slots.peek_options(plugin, publications=["p"])


def _commits(conn: Any, slot: str, plugin: str, options: list[str]) -> list[tuple[int, int]]:
    """(boundary LSN, changes up to it) from a plain peek: what next_boundary must agree with."""
    out, changes = [], 0
    for lsn, _xid, data in slots.peek_rows(conn, slot, plugin, options=options):
        head = bytes(data[:2]) if plugin == "pgoutput" else str(data)[:26].encode()
        if plugin == "pgoutput":
            if head[:1] in (b"I", b"U", b"D", b"T", b"M"):
                changes += 1
            if head[:1] == b"C" or head == b"M\x00":
                out.append((int(lsn), changes))
        else:
            if head.startswith((b"table ", b"message: ")):
                changes += 1
            if head.startswith((b"COMMIT", b"message: transactional: 0")):
                out.append((int(lsn), changes))
    return out


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_boundaries_are_the_peeks_commit_rows_within_the_limits(db: Any, conn: Any, plugin: str) -> None:
    slot, options = _setup(db, conn, plugin)
    commits = _commits(conn, slot, plugin, options)
    start = Lsn(slots.get_slot(conn, slot).confirmed_flush_lsn or 0)
    assert len(commits) >= len(SIZES) + 2

    everything = next_boundary(conn, slot, plugin, options, after=start)
    assert (everything.end, everything.changes, everything.over_limit) == (commits[-1][0], commits[-1][1], False)

    for limit in (1, 3, 4, 10, 50, 1000):
        found = next_boundary(conn, slot, plugin, options, after=start, max_changes=limit)
        fitting = [c for c in commits if c[1] <= limit]
        expected = fitting[-1] if fitting else commits[0]  # one transaction larger than the limit passes whole
        assert (found.end, found.changes) == expected, limit
        assert found.over_limit == (not fitting)

    # after a boundary: only what follows it, counted from there
    middle, before = commits[3]
    found = next_boundary(conn, slot, plugin, options, after=Lsn(middle), max_changes=30)
    fitting = [(lsn, n - before) for lsn, n in commits if lsn > middle and n - before <= 30]
    assert (found.end, found.changes) == fitting[-1]

    # a cap: nothing past it, even when it falls inside a later commit record
    cap = Lsn(commits[5][0] - 1)
    assert next_boundary(conn, slot, plugin, options, after=start, cap=cap).end == commits[4][0]
    assert next_boundary(conn, slot, plugin, options, after=Lsn(commits[-1][0])).end is None


def test_a_bytes_limit_and_a_small_first_peek_widen_until_the_limit(db: Any, conn: Any) -> None:
    slot, options = _setup(db, conn, "pgoutput")
    start = Lsn(slots.get_slot(conn, slot).confirmed_flush_lsn or 0)
    whole = next_boundary(conn, slot, "pgoutput", options, after=start)
    half = next_boundary(conn, slot, "pgoutput", options, after=start, max_bytes=whole.bytes // 2)
    assert half.end is not None and whole.end is not None and half.end < whole.end
    assert 0 < half.bytes <= whole.bytes // 2
    # rows limit: the first peek is bounded, later ones widen until a limit is reached
    assert next_boundary(conn, slot, "pgoutput", options, after=start, max_changes=80).changes == sum(SIZES[:7])
    assert slots.get_slot(conn, slot).confirmed_flush_lsn == start  # peeks never move the slot
