"""``pgpoll snapshot``: the rows a table holds now, read in chunks by Spark tasks, in the typed tables' form.

:mod:`pgpoll.snapshot.run` is the driver (preflight, leases, plan or resume,
the Spark jobs, the convergence wait, the summary); :mod:`pgpoll.snapshot.chunk_task`
is what one Spark task does with one chunk. What is read comes from
:mod:`pgpoll.source.snapshot.catalog` and :mod:`pgpoll.source.snapshot.reads`;
where it is written, :mod:`pgpoll.sink.snapshot_store`.
"""
