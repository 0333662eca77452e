"""``materialize --format delta``: a table's state as a Delta table, committed once per run through delta-rs.

``state`` (the materializer for Delta), ``table`` (pin a version, commit the Parquet files Spark or the
driver wrote), ``files`` (which files an incremental run rewrites, and the key-ordered layout that keeps
them few), ``names`` (column names Delta forbids, stored as reversible ``%XX``).

May import: ``pgpoll.materialize``'s format-free modules (the run, ``state``, ``change_summary``,
``task_files``), ``pgpoll.materialize.driver``, ``pgpoll.sink``, ``pgpoll.typed`` and its own package;
never ``pgpoll.materialize.iceberg``.
"""
