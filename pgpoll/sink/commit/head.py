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
    """The high-water mark (None: a new output) and the record with the largest ``seq``, read afresh.

    The record is None for a new output, and for a version-1 head folded into
    a checkpoint (older pgpoll recorded no server).
    """
    state = log.state()
    if state.head == 0:
        return state.high_water_mark, None
    if state.tail and state.tail[-1].seq == state.head:
        return state.high_water_mark, state.tail[-1]
    path = log.record_path(state.head)
    if not log.fs.exists(path):
        return state.high_water_mark, None
    return state.high_water_mark, CommitRecord.parse(log.fs.read_text(path), path, path.rsplit("/", 1)[-1])
