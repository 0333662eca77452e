"""Airflow 3 operators for pgpoll's jobs: ``spark-submit`` of ingest, materialize and snapshot, exit codes mapped.

The DAG file users copy into their DAG folder, ``jobs/airflow/pgpoll_dag.py``,
builds its two DAGs from :mod:`pgpoll.airflow.operators`. On the Airflow side
this package needs Apache Airflow 3 and ``apache-airflow-providers-apache-spark``
and nothing of pgpoll's dependencies: it imports only Airflow and the
standard library, so pgpoll is installed there without them
(``pip install --no-deps`` of ``make dist``'s wheel). On the machine that
runs the tasks: ``spark-submit`` on ``PATH`` and a Python for the Spark
driver that has pgpoll's dependencies (``PYSPARK_PYTHON``; pgpoll itself can
come from ``py_files``, see ``make dist``, which also builds ``ingest.py``,
``materialize.py`` and ``snapshot.py``).

DAGs: ``pgpoll_ingest`` (tasks ``ingest >> materialize``, on a schedule),
``pgpoll_snapshot`` (task ``snapshot``, triggered by hand only) and
``pgpoll_housekeeping`` (task ``housekeeping``, daily by default: ``pgpoll compact``
where the installed pgpoll has it, then ``pgpoll retain``: ``housekeeping.py``,
which ``make dist`` puts beside ``ingest.py``).

Configuration
-------------
Variable ``pgpoll_schedule``
    Cron expression, read when the DAG is parsed (default ``*/15 * * * *``).
Variable ``pgpoll_ingest`` (JSON, read when the tasks run)
    ``{"application": "/opt/pgpoll/ingest.py", "py_files": "/opt/pgpoll/pgpoll.zip",
    "slot": "orders_slot", "output": "s3://lake/pg/orders", "publication": "orders_pub",
    "max_seconds": 600, "typed_tables": true,
    "materialize": {"application": "/opt/pgpoll/materialize.py", "to": "s3://lake/pg/orders_state",
    "format": "delta"},
    "snapshot": {"application": "/opt/pgpoll/snapshot.py", "parallelism": 4}}``;
    ``py_files`` and ``publication`` may be empty (test_decoding needs no
    publication), ``max_seconds`` defaults to 600. ``typed_tables`` (JSON
    ``true``/``false``, default false) passes ``--typed-tables`` to ingest;
    materialize needs it. ``materialize`` is optional: ``application`` is
    required in it, ``to`` (the state's destination) is optional and defaults
    to ``OUTPUT/state``; ``format`` (``parquet``, the default, ``delta``:
    a Delta Lake table per table, or ``iceberg``: an Iceberg table per table
    in a catalog) is passed as ``--format``; ``catalog`` (``format: iceberg``
    only: the name of a pyiceberg catalog configured where the driver runs,
    in ``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*``) as
    ``--catalog``; any other key
    fails the task (a typo would otherwise write the state somewhere else).
    ``snapshot`` is optional too: ``application`` defaults to ``snapshot.py``
    beside ``application`` (where ``make dist`` puts it), ``parallelism`` (a
    positive integer: concurrent chunk tasks) to pgpoll's default; any other
    key fails the task. ``py_files``, ``slot``, ``output`` and ``publication``
    are shared by all the jobs.
Variable ``pgpoll_housekeeping_schedule``
    When ``pgpoll_housekeeping`` runs (default ``@daily``).
``housekeeping`` in Variable ``pgpoll_ingest`` (optional)
    ``{"retention": "7d", "application": "/opt/pgpoll/housekeeping.py"}``:
    ``retention`` is passed as ``pgpoll retain --retention`` (absent: the
    job's ``PGPOLL_RETENTION``, else off, and nothing is removed);
    ``application`` defaults to ``housekeeping.py`` beside ``application``.
    Exit 3 (another retain run holds the output) skips the task; 2 and 5 fail
    it without retry. The job's summary line (``status``, ``exit_code``,
    ``steps``) is the XCom ``return_value``.
Connection ``pgpoll_source`` (Postgres)
    The source database; passed to the ingest and snapshot jobs as
    ``PGPOLL_DSN`` in the environment, never on the command line. Materialize
    does not connect to PostgreSQL and gets no DSN.
Connection ``pgpoll_spark`` (Spark)
    The master: ``spark://host:7077``, ``yarn``, ``local[*]``...

Behaviour
---------
- One run at a time (``max_active_runs=1``), no backfill (``catchup=False``): each
  run drains whatever the slot holds, so missed intervals need no catching up.
- ingest: exit 3 (slot busy: another run or consumer holds it) ends the task as
  *skipped*, not failed, and is not retried. Exits 2 (usage) and 6 (decode)
  fail at once: a retry cannot fix them. Anything else (server unreachable,
  sink errors) is retried with exponential backoff. The run summary (pgpoll's
  JSON line) is the task's XCom ``return_value``; on a skip or failure it is
  pushed under the key ``summary``.
- materialize: ``spark-submit materialize.py --output OUTPUT [--to TO] [--format F] [--catalog C] --json``.
  Exit 3 (another materialize is writing the destination) ends the task as
  *skipped*, not retried, like ingest's.
  Its XCom ``return_value`` is the list of per-table results (one JSON line per
  table: ``table``, ``path``, ``rows``, ``position``, ``mode``
  full/incremental/unchanged, ``batches``, ``warnings``); each warning is also
  logged as a task warning. Exits 2 (usage) and 5 fail at once, without
  retry: 5 means OUTPUT holds no pgpoll output or no typed tables (ingest ran
  without ``typed_tables``, or ``output`` is wrong), which only a change of
  configuration fixes, and 5 is also a storage failure that needs a look (the
  output cannot be opened, or a state directory cannot be renamed) or, with
  ``format: delta`` or ``iceberg``, another writer's version or snapshot of a
  table committed after the run read it, which pgpoll reports and does not
  merge over (or, for Iceberg, a column type change Iceberg cannot promote). Anything
  else (exit 1, Spark or the cluster failing, 130/143 when the run was
  interrupted by SIGINT/SIGTERM) is retried with backoff; a retry
  is safe: a failed run leaves the old state or none (then the retry rebuilds
  it) and the retry clears the failed run's scratch.
- materialize runs only after an ingest that *succeeded* (the default trigger
  rule ``all_success``, set explicitly): after a skipped ingest it is skipped
  too, after a failed one it is ``upstream_failed``. Deliberately not
  ``none_failed``: a skipped ingest means another consumer or pgpoll run holds
  the slot right now, and a materialize of the same destination may be
  running too (it would exit 3, holding the destination's lease), and
  ``max_active_runs=1`` serializes only this DAG's runs. The next successful
  ingest is followed by a materialize that catches up on every batch since.
- "No materialize configured": Airflow builds the task list when it parses the
  file, but ``pgpoll_ingest`` is read when the tasks run, so the materialize
  task always exists; when the Variable has no ``materialize`` key (or it is
  ``null``) the task ends *skipped* at once, before any spark-submit, and the
  DAG run still succeeds. Adding the key turns it on at the next run, no
  redeploy needed.
- pgpoll_snapshot (``schedule=None``: ``airflow dags trigger pgpoll_snapshot
  --conf '{"tables": "public.t"}'``; param ``tables``, a comma list of tables
  or patterns, empty for every captured table): ``spark-submit snapshot.py
  --slot SLOT --output OUTPUT [--publication P] [--tables T] [--parallelism N]
  --json``. Exit 3 (a snapshot of one of these tables is already running)
  ends the task *skipped*; exits 2 (usage: a pattern matching nothing, a
  table outside the publication, an ``hdfs:`` output) and 5 (the output: a
  store's wrong credentials, a missing bucket) fail at once; anything
  else (4: lock timeout, slot missing or lost, a hot standby; Spark failing;
  130/143) is retried with backoff, which is safe: a rerun with the same
  arguments resumes, reading only the chunks it lacks. Runs queue one at a
  time. The summary is the XCom ``return_value`` (``summary`` on a skip or
  failure). Order: create the slot, start the ingest schedule, run the
  snapshot, then materialize.
"""
