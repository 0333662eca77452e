"""Airflow 3 DAG: run pgpoll's ingest job, then (optionally) materialize, with ``spark-submit`` on a cron schedule.

Copy this file into your DAG folder. It needs Apache Airflow 3 and
``apache-airflow-providers-apache-spark`` on the Airflow side, and on the
machine that runs the tasks: ``spark-submit`` on ``PATH`` and a Python for the
Spark driver that has pgpoll's dependencies (``PYSPARK_PYTHON``; pgpoll itself
can come from ``py_files``, see ``make dist``, which also builds
``materialize.py``).

Tasks: ``ingest >> materialize``.

Configuration
-------------
Variable ``pgpoll_schedule``
    Cron expression, read when the DAG is parsed (default ``*/15 * * * *``).
Variable ``pgpoll_ingest`` (JSON, read when the tasks run)
    ``{"application": "/opt/pgpoll/ingest.py", "py_files": "/opt/pgpoll/pgpoll.zip",
    "slot": "orders_slot", "output": "s3a://lake/pg/orders", "publication": "orders_pub",
    "max_seconds": 600, "typed_tables": true,
    "materialize": {"application": "/opt/pgpoll/materialize.py", "to": "s3a://lake/pg/orders_state",
    "format": "delta"}}``;
    ``py_files`` and ``publication`` may be empty (test_decoding needs no
    publication), ``max_seconds`` defaults to 600. ``typed_tables`` (JSON
    ``true``/``false``, default false) passes ``--typed-tables`` to ingest;
    materialize needs it. ``materialize`` is optional: ``application`` is
    required in it, ``to`` (the state's destination) is optional and defaults
    to ``OUTPUT/state``; ``format`` (``parquet``, the default, or ``delta``:
    a Delta Lake table per table) is passed as ``--format``; any other key
    fails the task (a typo would otherwise write the state somewhere else).
    ``py_files`` and ``output`` are shared with ingest.
Connection ``pgpoll_source`` (Postgres)
    The source database; passed to the ingest job as ``PGPOLL_DSN`` in the
    environment, never on the command line. Materialize does not connect to
    PostgreSQL and gets no DSN.
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
- materialize: ``spark-submit materialize.py --output OUTPUT [--to TO] [--format F] --json``.
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
  ``format: delta``, another writer's version of a table committed after the
  run read it, which pgpoll reports and does not merge over. Anything
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

Why ``SparkSubmitOperator`` subclasses: the provider raises one
``AirflowException`` for every non-zero exit and logs spark-submit's output
line by line without keeping it. spark-submit merges the Python driver's
stderr into its stdout, so the summary is the last line that is a JSON object,
not the last line. The subclasses watch the lines the hook logs, keep pgpoll's
JSON lines, and turn the exit code (ingest: the summary's ``exit_code``;
materialize, which prints no JSON when it fails: spark-submit's own exit code,
which is the driver's in client and local mode) into skip / fail / retry.
Optional flags (``--typed-tables``, ``--to``) are added in ``execute`` from
rendered template fields, since a templated list cannot drop an element.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, TriggerRule, Variable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

SLOT_BUSY = 3
NOT_RETRIED = {2: "usage or configuration error", 6: "decode error (the row is saved under _pgpoll/rejects/)"}
MATERIALIZE_NOT_RETRIED = {
    2: "usage or configuration error",
    5: "no pgpoll output or no typed tables at the output (is typed_tables on?), the storage failed, "
       "or another writer committed to a Delta table this run read (not merged over)",
}
MATERIALIZE_KEYS = {"application", "to", "format"}
MATERIALIZE_FORMATS = ("parquet", "delta")
CONFIG = "var.json.pgpoll_ingest"


def parse_summary(line: str) -> dict[str, Any] | None:
    """pgpoll's run summary if ``line`` is one, else None."""
    obj = _json_object(line)
    return obj if obj is not None and "status" in obj and "slot" in obj and "exit_code" in obj else None


def parse_table_state(line: str) -> dict[str, Any] | None:
    """One table's result of ``pgpoll materialize --json`` if ``line`` is one, else None."""
    obj = _json_object(line)
    return obj if obj is not None and {"table", "path", "rows", "mode"} <= obj.keys() else None


def _json_object(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _rendered_json(value: Any, what: str) -> Any:
    """The value of a template field rendered with ``| tojson``; a config error fails the task without retry."""
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError as exc:
        raise AirflowFailException(f"Variable pgpoll_ingest: {what} is not valid JSON: {value!r}") from exc


class _WatchedSparkSubmit(SparkSubmitOperator):
    """Feeds every line spark-submit prints (which the hook logs) to :meth:`_line`."""

    def _line(self, line: str) -> None:
        raise NotImplementedError

    def _watch(self, lines: Iterator[Any]) -> Iterator[Any]:
        for line in lines:
            self._line(str(line))
            yield line

    def _get_hook(self) -> Any:
        hook = super()._get_hook()
        process_log = hook._process_spark_submit_log  # the provider's log reader; it keeps no lines
        hook._process_spark_submit_log = lambda itr: process_log(self._watch(itr))
        return hook


class PgpollIngestOperator(_WatchedSparkSubmit):
    """``spark-submit`` of pgpoll's ingest job: summary to XCom, exit 3 skipped, exits 2 and 6 not retried.

    ``typed_tables`` (templated) renders to JSON ``true`` or ``false``; true adds ``--typed-tables``.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "typed_tables")

    def __init__(self, *, typed_tables: str = "false", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.typed_tables = typed_tables
        self.summary: dict[str, Any] | None = None

    def _line(self, line: str) -> None:
        found = parse_summary(line)
        if found is not None:
            self.summary = found

    def execute(self, context: Any) -> dict[str, Any] | None:
        self.summary = None
        typed = _rendered_json(self.typed_tables, "typed_tables")
        if not isinstance(typed, bool):
            raise AirflowFailException(f"Variable pgpoll_ingest: typed_tables must be true or false, not {typed!r}")
        args = [a for a in self.application_args or [] if a != "--typed-tables"]
        self.application_args = [*args, "--typed-tables"] if typed else args
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


class PgpollMaterializeOperator(_WatchedSparkSubmit):
    """``spark-submit`` of pgpoll's materialize job: per-table results to XCom, exits 2 and 5 not retried.

    ``materialize`` (templated) renders to the JSON of the Variable's
    ``materialize`` object, or ``null``: then the task skips itself (not
    configured). The application comes from it, and ``--to`` when it has ``to``.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "materialize")

    def __init__(self, *, materialize: str = "null", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.materialize = materialize
        self.tables: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def _line(self, line: str) -> None:
        found = parse_table_state(line)
        if found is not None:
            self.tables.append(found)
        elif line.lstrip().startswith(("error:", "unexpected error:", "fix:")):
            self.errors.append(line.strip())

    def _configure(self) -> None:
        config = _rendered_json(self.materialize, "materialize")
        if config is None:
            raise AirflowSkipException("materialize is not configured (no \"materialize\" in Variable pgpoll_ingest)")
        if not isinstance(config, dict):
            raise AirflowFailException(f"Variable pgpoll_ingest: materialize must be an object, not {config!r}")
        unknown = sorted(set(config) - MATERIALIZE_KEYS)
        if unknown:
            raise AirflowFailException(
                f"Variable pgpoll_ingest: unknown key(s) {unknown} in materialize (allowed: {sorted(MATERIALIZE_KEYS)})"
            )
        application, to = config.get("application"), config.get("to")
        if not isinstance(application, str) or not application:
            raise AirflowFailException(
                "Variable pgpoll_ingest: materialize.application (the path of materialize.py) is required"
            )
        if to is not None and not isinstance(to, str):
            raise AirflowFailException(f"Variable pgpoll_ingest: materialize.to must be a string, not {to!r}")
        fmt = config.get("format")
        if fmt is not None and fmt not in MATERIALIZE_FORMATS:
            raise AirflowFailException(
                f"Variable pgpoll_ingest: materialize.format must be one of {list(MATERIALIZE_FORMATS)}, not {fmt!r}"
            )
        self.application = application
        args = list(self.application_args or [])
        for flag in ("--to", "--format"):
            if flag in args:  # execute() again on the same object: drop the pair added last time
                at = args.index(flag)
                del args[at:at + 2]
        args = [*args, "--to", to] if to else args
        self.application_args = [*args, "--format", fmt] if fmt else args

    def _exit_code(self) -> int | None:
        process = getattr(self._hook, "_submit_sp", None) if self._hook is not None else None
        return process.returncode if process is not None else None

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.tables, self.errors = [], []
        self._configure()
        try:
            super().execute(context)
        except AirflowException as exc:
            code = self._exit_code()
            detail = f": {' '.join(self.errors)}" if self.errors else ""
            if code == SLOT_BUSY:
                raise AirflowSkipException(
                    f"pgpoll materialize: another run is writing the destination (exit 3){detail}") from exc
            if code in MATERIALIZE_NOT_RETRIED:
                reason = MATERIALIZE_NOT_RETRIED[code]
                raise AirflowFailException(f"pgpoll materialize exited {code}: {reason}{detail}") from exc
            raise
        for table in self.tables:
            for warning in table.get("warnings") or []:
                self.log.warning("pgpoll materialize: %s", warning)
        return self.tables


with DAG(
    dag_id="pgpoll_ingest",
    description="Drain a PostgreSQL logical replication slot into Parquet with pgpoll, then materialize",
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
        typed_tables="{{ %s.get('typed_tables', false) | tojson }}" % CONFIG,
        env_vars={"PGPOLL_DSN": "{{ conn.pgpoll_source.get_uri() }}"},
        conf={"spark.ui.showConsoleProgress": "false"},
    )
    materialize = PgpollMaterializeOperator(
        task_id="materialize",
        conn_id="pgpoll_spark",
        name="pgpoll-materialize",
        materialize="{{ %s.get('materialize') | tojson }}" % CONFIG,
        py_files="{{ %s.get('py_files', '') }}" % CONFIG,
        application_args=["--output", "{{ %s.output }}" % CONFIG, "--json"],
        conf={"spark.ui.showConsoleProgress": "false"},
        # only after a successful ingest: skipped after a skipped one (see the module docstring)
        trigger_rule=TriggerRule.ALL_SUCCESS,
    )
    ingest >> materialize
