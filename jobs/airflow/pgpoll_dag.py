"""Airflow 3 DAG: run pgpoll's ingest job with ``spark-submit`` on a cron schedule.

Copy this file into your DAG folder. It needs Apache Airflow 3 and
``apache-airflow-providers-apache-spark`` on the Airflow side, and on the
machine that runs the task: ``spark-submit`` on ``PATH`` and a Python for the
Spark driver that has pgpoll's dependencies (``PYSPARK_PYTHON``; pgpoll itself
can come from ``py_files``, see ``make dist``).

Configuration
-------------
Variable ``pgpoll_schedule``
    Cron expression, read when the DAG is parsed (default ``*/15 * * * *``).
Variable ``pgpoll_ingest`` (JSON, read when the task runs)
    ``{"application": "/opt/pgpoll/ingest.py", "py_files": "/opt/pgpoll/pgpoll.zip",
    "slot": "orders_slot", "output": "s3a://lake/pg/orders", "publication": "orders_pub",
    "max_seconds": 600}``; ``py_files`` and ``publication`` may be empty
    (test_decoding needs no publication), ``max_seconds`` defaults to 600.
Connection ``pgpoll_source`` (Postgres)
    The source database; passed to the job as ``PGPOLL_DSN`` in the environment,
    never on the command line.
Connection ``pgpoll_spark`` (Spark)
    The master: ``spark://host:7077``, ``yarn``, ``local[*]``...

Behaviour
---------
- One run at a time (``max_active_runs=1``), no backfill (``catchup=False``): each
  run drains whatever the slot holds, so missed intervals need no catching up.
- Exit 3 (slot busy: another run or consumer holds it) ends the task as
  *skipped*, not failed, and is not retried. Exits 2 (usage) and 6 (decode)
  fail at once: a retry cannot fix them. Anything else (server unreachable,
  sink errors) is retried with exponential backoff.
- The run summary (pgpoll's JSON line) is the task's XCom ``return_value``; on
  a skip or failure it is pushed under the key ``summary``.
- A downstream ``materialize`` task (merging changes into current-state tables)
  is not part of this DAG: pgpoll has no materialize command yet.

Why a ``SparkSubmitOperator`` subclass: the provider raises one
``AirflowException`` for every non-zero exit and logs spark-submit's output
line by line without keeping it. spark-submit merges the Python driver's
stderr into its stdout, so the summary is the last line that is a JSON object,
not the last line. The subclass watches the lines the hook logs, keeps the
summary, and turns its ``exit_code`` into skip / fail / retry.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Iterator, Optional

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Variable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

SLOT_BUSY = 3
NOT_RETRIED = {2: "usage or configuration error", 6: "decode error (the row is saved under _pgpoll/rejects/)"}
CONFIG = "var.json.pgpoll_ingest"


def parse_summary(line: str) -> Optional[dict[str, Any]]:
    """pgpoll's run summary if ``line`` is one, else None."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "status" in obj and "slot" in obj and "exit_code" in obj else None


class PgpollIngestOperator(SparkSubmitOperator):
    """``spark-submit`` of pgpoll's ingest job: summary to XCom, exit 3 skipped, exits 2 and 6 not retried."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.summary: Optional[dict[str, Any]] = None

    def _watch(self, lines: Iterator[Any]) -> Iterator[Any]:
        for line in lines:
            found = parse_summary(str(line))
            if found is not None:
                self.summary = found
            yield line

    def _get_hook(self) -> Any:
        hook = super()._get_hook()
        process_log = hook._process_spark_submit_log  # the provider's log reader; it keeps no lines
        hook._process_spark_submit_log = lambda itr: process_log(self._watch(itr))
        return hook

    def execute(self, context: Any) -> Optional[dict[str, Any]]:
        self.summary = None
        try:
            super().execute(context)
        except AirflowException as exc:
            code = self.summary.get("exit_code") if self.summary else None
            if self.summary is not None:
                context["ti"].xcom_push(key="summary", value=self.summary)
            if code == SLOT_BUSY:
                raise AirflowSkipException("pgpoll: the slot is busy (exit 3); another run holds it") from exc
            if code in NOT_RETRIED:
                raise AirflowFailException(f"pgpoll exited {code}: {NOT_RETRIED[code]}") from exc
            raise
        if self.summary is None:
            raise AirflowException("spark-submit succeeded but printed no pgpoll run summary")
        return self.summary


with DAG(
    dag_id="pgpoll_ingest",
    description="Drain a PostgreSQL logical replication slot into Parquet with pgpoll",
    schedule=Variable.get("pgpoll_schedule", default="*/15 * * * *"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 4,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=30),
    },
    tags=["pgpoll", "cdc"],
) as dag:
    ingest = PgpollIngestOperator(
        task_id="ingest",
        conn_id="pgpoll_spark",
        name="pgpoll-ingest",
        application="{{ %s.application }}" % CONFIG,
        py_files="{{ %s.get('py_files', '') }}" % CONFIG,
        application_args=[
            "--slot", "{{ %s.slot }}" % CONFIG,
            "--output", "{{ %s.output }}" % CONFIG,
            "--publication", "{{ %s.get('publication', '') }}" % CONFIG,
            "--max-seconds", "{{ %s.get('max_seconds', 600) }}" % CONFIG,
        ],
        env_vars={"PGPOLL_DSN": "{{ conn.pgpoll_source.get_uri() }}"},
        conf={"spark.ui.showConsoleProgress": "false"},
    )
