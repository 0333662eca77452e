"""``pgpoll snapshot``: the rows a table holds now, read in chunks by Spark tasks, in the typed tables' form.

:mod:`pgpoll.snapshot.run` is the driver (preflight, leases, plan or resume,
the Spark jobs, the convergence wait, the summary); :mod:`pgpoll.snapshot.chunk_task`
is what one Spark task does with one chunk. What is read comes from
:mod:`pgpoll.source.snapshot.catalog` and :mod:`pgpoll.source.snapshot.reads`;
where it is written, :mod:`pgpoll.sink.snapshot_store`. ``pgpoll resync``
(:mod:`pgpoll.snapshot.resync`) marks a gap in the commit log and snapshots
every table after it; on a server whose history left the output's (an unsafe
failover) :mod:`pgpoll.snapshot.resync_history` makes that snapshot hold
everything the slot will skip.
"""
