"""The spilling transaction buffer keeps order and bounds what it holds in memory."""

from __future__ import annotations

from pgpoll.changes import Column, Op, RowChange
from pgpoll.decode.assembler import TransactionAssembler
from pgpoll.changes import Begin, Commit
from pgpoll.ingest.spill import SpillBuffer


def test_values_come_back_in_order_across_spills() -> None:
    buf = SpillBuffer(limit=3)
    for i in range(10):
        buf.append(("row", i))
    assert buf.spilled == 9 and len(buf) == 10
    assert list(buf) == [("row", i) for i in range(10)]
    buf.append(("row", 10))  # appending after a read keeps working
    assert [v[1] for v in buf] == list(range(11))
    buf.close()


def test_an_assembler_with_a_spilling_buffer_gives_the_same_records_as_with_a_list() -> None:
    cols = (Column("id", "integer"),)
    events = [Begin(xid=9, lsn=100)]
    events += [RowChange(Op.INSERT, "public", "t", cols, None, {"id": str(i)}, lsn=100 + i) for i in range(25)]
    events.append(Commit(xid=9, lsn=500))
    plain = TransactionAssembler()
    spilling = TransactionAssembler(buffer_factory=lambda: SpillBuffer(limit=4))
    expected = [r for e in events for r in plain.feed(e)]
    got = [r for e in events for r in spilling.feed_iter(e)]
    assert got == expected and len(got) == 25
    assert [r.seq for r in got] == list(range(25)) and {r.commit_lsn for r in got} == {500}
