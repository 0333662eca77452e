"""Airflow 3 DAGs: pgpoll's ingest (then materialize) on a cron schedule, and its snapshot by hand, with ``spark-submit``.

Copy this file into your DAG folder. Airflow's environment needs Apache
Airflow 3, ``apache-airflow-providers-apache-spark`` and pgpoll installed
without its dependencies (``pip install --no-deps`` of ``make dist``'s wheel):
the operators come from :mod:`pgpoll.airflow.operators`, which imports only
Airflow and the standard library. The tasks' machine needs ``spark-submit``
and a Python with pgpoll's dependencies for the Spark driver.

DAGs: ``pgpoll_ingest`` (tasks ``ingest >> materialize``, on a schedule),
``pgpoll_snapshot`` (task ``snapshot``, triggered by hand only) and
``pgpoll_housekeeping`` (task ``housekeeping``: compaction and retention, daily
by default: Variable ``pgpoll_housekeeping_schedule``). Configured
by the Variables ``pgpoll_schedule`` (a cron expression, read when the DAG is
parsed; default ``*/15 * * * *``) and ``pgpoll_ingest`` (JSON: the jobs'
options, read when the tasks run) and the Connections ``pgpoll_source`` (the
database) and ``pgpoll_spark`` (the master). Every key of ``pgpoll_ingest``,
and what each exit code does to a task: :mod:`pgpoll.airflow`.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param, TriggerRule, Variable

from pgpoll.airflow.operators import (
    CONFIG,
    RETRIES,
    SOURCE_ENV,
    PgpollHousekeepingOperator,
    PgpollIngestOperator,
    PgpollMaterializeOperator,
    PgpollSnapshotOperator,
    spark_task_args,
)

with DAG(
    dag_id="pgpoll_ingest",
    description="Drain a PostgreSQL logical replication slot into Parquet with pgpoll, then materialize",
    schedule=Variable.get("pgpoll_schedule", default="*/15 * * * *"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=dict(RETRIES),
    tags=["pgpoll", "cdc"],
) as dag:
    ingest = PgpollIngestOperator(**spark_task_args(
        task_id="ingest",
        name="pgpoll-ingest",
        application="{{ %s.application }}" % CONFIG,
        application_args=[
            "--slot", "{{ %s.slot }}" % CONFIG,
            "--output", "{{ %s.output }}" % CONFIG,
            "--publication", "{{ %s.get('publication', '') }}" % CONFIG,
            "--max-seconds", "{{ %s.get('max_seconds', 600) }}" % CONFIG,
        ],
        typed_tables="{{ %s.get('typed_tables', false) | tojson }}" % CONFIG,
        env_vars=dict(SOURCE_ENV),
    ))
    materialize = PgpollMaterializeOperator(**spark_task_args(
        task_id="materialize",
        name="pgpoll-materialize",
        materialize="{{ %s.get('materialize') | tojson }}" % CONFIG,
        application_args=["--output", "{{ %s.output }}" % CONFIG, "--json"],
        # only after a successful ingest: skipped after a skipped one (see pgpoll.airflow)
        trigger_rule=TriggerRule.ALL_SUCCESS,
    ))
    ingest >> materialize

with DAG(
    dag_id="pgpoll_snapshot",
    description="Read the captured tables' current rows into the output with pgpoll snapshot (triggered by hand)",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=dict(RETRIES),
    params={"tables": Param(
        "", type="string",
        description="Comma list of tables or patterns (schema.table); empty: every captured table",
    )},
    tags=["pgpoll", "cdc"],
) as snapshot_dag:
    PgpollSnapshotOperator(**spark_task_args(
        task_id="snapshot",
        name="pgpoll-snapshot",
        application="{{ %s.get('application', '') }}" % CONFIG,
        snapshot="{{ %s.get('snapshot') | tojson }}" % CONFIG,
        publication="{{ %s.get('publication', '') }}" % CONFIG,
        tables="{{ params.tables }}",
        application_args=["--slot", "{{ %s.slot }}" % CONFIG, "--output", "{{ %s.output }}" % CONFIG, "--json"],
        env_vars=dict(SOURCE_ENV),
    ))

with DAG(
    dag_id="pgpoll_housekeeping",
    description="Compact the output's small batch files and remove batches older than the retention (pgpoll retain)",
    schedule=Variable.get("pgpoll_housekeeping_schedule", default="@daily"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=dict(RETRIES),
    tags=["pgpoll", "cdc"],
) as housekeeping_dag:
    # compaction (when this pgpoll has `pgpoll compact`), then retention; the states' maintenance runs in materialize
    PgpollHousekeepingOperator(**spark_task_args(
        task_id="housekeeping",
        name="pgpoll-housekeeping",
        application="{{ %s.application }}" % CONFIG,
        housekeeping="{{ %s.get('housekeeping') | tojson }}" % CONFIG,
        application_args=["--output", "{{ %s.output }}" % CONFIG],
    ))
