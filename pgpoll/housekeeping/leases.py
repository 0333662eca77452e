"""The two housekeeping leases, taken together: ``pgpoll compact`` and ``pgpoll retain`` never run at once.

Each command has a lease of its own (``_pgpoll/compact-lease.json``,
``_pgpoll/leases/retain.json``) and takes the other's too, for the whole run:
run together they could lose or resurrect rows. A compaction that read the
commit log before a retention removed its records would merge batches below
the new floor into a partition its record then names, and its Delta version
would add them back after retention's removes; a retention that read the
compaction map before a merge was recorded would leave that merge's files
(and its Delta ``add``) behind the floor. So whichever is second refuses
with :class:`pgpoll.errors.SlotBusyError` (exit 3) before it changes
anything. Both runs take their own lease first, then the other's, and give
both back: of two started together, at least one is refused (both may be;
run them one after the other, as the daily job does). The other lease is
renewed from a thread (:class:`LeaseKeeper`) for as long as it is held.

Each command also checks the other's traces where it matters (compaction
re-reads the retention floor before it creates its record; retention applies
every compaction record to the Delta log before it removes anything), so a
run whose lease was taken over while it stalled does not undo the other's
work either.
"""

from __future__ import annotations

from types import TracebackType

from pgpoll.sink import layout
from pgpoll.sink.commit.lease import Lease, LeaseKeeper
from pgpoll.sink.stores.output_fs import OutputFs


def compaction_lease(fs: OutputFs, run: str) -> Lease:
    """The lease of ``pgpoll compact`` (one compaction per output at a time)."""
    return Lease(fs, run=run, slot="", path=layout.COMPACTION_LEASE, what="compaction", holds="the compaction of")


def retention_lease(fs: OutputFs, run: str) -> Lease:
    """The lease of ``pgpoll retain`` (one retention per output at a time)."""
    return Lease(fs, run=run, slot="", path=layout.RETAIN_LEASE, what="pgpoll retain run", holds="the output's retention")


class OtherLease:
    """The other housekeeping command's lease, held (and renewed from a thread) for a whole run.

    ``with OtherLease(lease):`` acquires it (:class:`SlotBusyError` at once when
    the other command holds it) and releases it at the end.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.keeper: LeaseKeeper | None = None

    def __enter__(self) -> OtherLease:
        self.lease.acquire()
        self.keeper = LeaseKeeper(self.lease)
        return self

    def check(self) -> None:
        """Raise the busy error if the other command took its lease over (this run stalled past its TTL)."""
        if self.keeper is not None:
            self.keeper.check()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        self.lease.release()
