"""The driver engine: small tables' states computed with pyarrow in the driver, no Spark job.

``run`` (when a table is small enough, and its state replayed in order), ``state`` (the replay itself),
``files`` (which files of a large Delta state a driver run rewrites; pure), ``host`` (what the engine
needs of the materialize run, as a Protocol, so this package never imports the run).

May import: ``pgpoll.materialize``'s format-free modules but the run (``host`` stands for it), the
key-ordered layout of ``pgpoll.materialize.delta`` (``files``, ``table``), ``pgpoll.sink``, ``pgpoll.typed``
and its own package; never ``pgpoll.materialize.run`` nor ``pgpoll.materialize.iceberg``.
"""
