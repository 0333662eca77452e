"""Where a batch's peek stops: a budget of WAL bytes, not a count of changes.

What a batch costs is WAL: the server reads every byte of it (from the
slot's ``restart_lsn``) and builds the peek's whole result before the first
row leaves it (a tuplestore that spills to a temporary file), and the
advance after the batch reads it once more. A count of changes says little
about that: 200,000 changes are 35 MB of WAL for small rows and gigabytes
for wide ones. And every batch has costs of its own that a bigger one
does not multiply: its plan, its peek's start (re-reading the WAL between
``restart_lsn`` and the slot's position, which trails by as much as the
server's running-transactions records allow), its commit-log record and
Delta version, its advance, and on a cluster a Spark job. So a batch
peeks up to ``upto_lsn`` = its start plus :data:`BATCH_WAL`, and the run's
memory does not grow with it: the task streams the result and spills a
large transaction to a local file (:mod:`pgpoll.ingest.batch_assembler`).

``--batch-changes`` still bounds the rows as well when it is given
(``upto_nchanges``), and ``--max-changes`` does as before.

A peek bounded by ``upto_lsn`` returns only the transactions whose commit
it reached, so one that finds nothing new while WAL remains (a single
transaction larger than the budget) is retried with twice the budget,
until the bound lies past the end of WAL.

When a batch's peek will read everything there is (no bound stops it short
of the WAL's end as read just before), the run's end-of-run heartbeat is
written *before* that peek (:mod:`pgpoll.ingest.run`): the batch takes it
in, and no second peek and advance are needed to consume it. A peek re-reads
from ``restart_lsn``, so after a backlog that second peek cost as much as a
third of the backlog's decode here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgpoll.lsn import Lsn
from pgpoll.source.slots import SlotInfo

BATCH_WAL = 1 << 30
"""The default WAL budget of a batch (``--batch-wal``): 1 GiB (docs/performance.md says why)."""


@dataclass(frozen=True)
class Bounds:
    """One batch's peek limits; ``None``: no such limit."""

    upto_lsn: int | None
    upto_nchanges: int | None

    @property
    def to_end(self) -> bool:
        """The peek reads up to the end of WAL as of its start: nothing but new writes can be left after it."""
        return self.upto_lsn is None and self.upto_nchanges is None

    def caught_up(self, peeked_rows: int) -> bool:
        """Whether the peek, having returned ``peeked_rows`` rows, read everything there was when it started."""
        if self.upto_lsn is not None:
            return False  # the WAL went on past the bound when the batch was planned
        return self.upto_nchanges is None or peeked_rows < self.upto_nchanges


def batch_bounds(
    slot: SlotInfo, high_water_mark: Lsn | None, *, batch_wal: int, growth: int = 1, changes: int | None = None,
) -> Bounds:
    """The limits of the next batch of ``slot`` (as just read) on an output at ``high_water_mark``.

    The peek starts at the slot's position, or at the high-water mark when
    the slot is behind it (the batch re-advances it there first, see
    :func:`pgpoll.ingest.batch_job.run_batch`); the WAL ends at the slot's
    position plus its lag. ``batch_wal`` (0: no WAL budget) is multiplied by ``growth`` (2, 4, ...
    after bounded peeks that found nothing); ``changes`` is the row limit
    (``--batch-changes``, or what ``--max-changes`` leaves), if any. No
    ``upto_lsn`` when the budget reaches the end of WAL: the peek then reads
    to its own end, which takes in whatever was written meanwhile too.
    """
    confirmed = int(slot.confirmed_flush_lsn) if slot.confirmed_flush_lsn is not None else 0
    start = max(confirmed, int(high_water_mark) if high_water_mark is not None else 0)
    budget = batch_wal * growth
    if budget <= 0 or slot.lag_bytes is None or confirmed + slot.lag_bytes - start <= budget:
        return Bounds(None, changes)
    return Bounds(start + budget, changes)
