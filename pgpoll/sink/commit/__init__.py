"""pgpoll's commit log: records, checkpoints, the lease, publishing a batch behind the fence, and recovery.

``records`` (one file per committed batch, its JSON), ``checkpoints`` (the fold start-up reads instead of
every record), ``log`` (``CommitLog``: the one owner of the format, read and written over any
``OutputFs``), ``lease`` (the fast "busy" answer), ``batches`` (moving a batch into place: stage, fence,
publish), ``recovery`` (a crashed or racing run's leftovers, fenced).

May import: ``pgpoll.errors``, ``pgpoll.lsn``, ``pgpoll.faults``, the rest of ``pgpoll.sink`` (stores,
layout, the change table) and its own package; never the server or Spark.
"""
