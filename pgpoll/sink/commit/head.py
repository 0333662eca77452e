"""The commit log's newest record: where the output ends and which server it was read from.

The gap check (:mod:`pgpoll.source.slot_gap`) needs the high-water mark and
the ``server`` field of the newest record. Start-up's state has the records
after the newest checkpoint; when a checkpoint has just folded them all the
head record is read by its name: one more file, whatever the history.
"""

from __future__ import annotations

from pgpoll.lsn import Lsn
from pgpoll.sink.commit.log import CommitLog, CommitRecord


def output_head(log: CommitLog) -> tuple[Lsn | None, CommitRecord | None]:
    """Where the slot feeding the output should be (None: a new output) and the record with the largest ``seq``.

    That position is the high-water mark, or, when the newest record is a gap
    marked by ``pgpoll resync``, the gap's ``resume``: the slot was moved
    there and the gap is on record. The record is None for a new output, and
    for a version-1 head folded into a checkpoint (older pgpoll recorded no
    server). Read afresh on every call.
    """
    state = log.state()
    record = None
    if state.head == 0:
        return state.high_water_mark, None
    if state.tail and state.tail[-1].seq == state.head:
        record = state.tail[-1]
    else:
        path = log.record_path(state.head)
        if log.fs.exists(path):
            record = CommitRecord.parse(log.fs.read_text(path), path, path.rsplit("/", 1)[-1])
    hwm = state.high_water_mark
    if record is not None and record.is_gap and record.resume is not None:
        resume = Lsn.parse(record.resume)
        hwm = resume if hwm is None or resume > hwm else hwm
    return hwm, record
