"""The operators of pgpoll's Airflow DAGs (:mod:`pgpoll.airflow` describes their configuration and behaviour).

Why ``SparkSubmitOperator`` subclasses: the provider raises one
``AirflowException`` for every non-zero exit and logs spark-submit's output
line by line without keeping it. spark-submit merges the Python driver's
stderr into its stdout, so the summary is the last line that is a JSON object,
not the last line. The subclasses watch the lines the hook logs, keep pgpoll's
JSON lines and error lines, and turn the exit code (the summary's
``exit_code`` where the job printed one, else spark-submit's own exit code,
which is the driver's in client and local mode) into skip / fail / retry.
Optional flags (``--typed-tables``, ``--to``, ``--tables``...) are added in
``execute`` from rendered template fields, since a templated list cannot drop
an element.

Every task passes its run to pgpoll as the OpenLineage parent
(:func:`lineage_parent_env`), where Airflow's OpenLineage provider is installed.

Only Airflow and the standard library are imported here: pgpoll is installed
in Airflow's environment without its dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

SLOT_BUSY = 3
NOT_RETRIED = {2: "usage or configuration error", 6: "decode error (the row is saved under _pgpoll/rejects/)"}
MATERIALIZE_NOT_RETRIED = {
    2: "usage or configuration error",
    5: "no pgpoll output or no typed tables at the output (is typed_tables on?), the storage failed, "
       "or another writer committed to a Delta table this run read (not merged over)",
}
SNAPSHOT_NOT_RETRIED = {
    2: "usage or configuration error (a table pattern that matches nothing, a table outside the publication...)",
    5: "the output cannot be used or the storage failed",
}
HOUSEKEEPING_NOT_RETRIED = {
    2: "usage or configuration error (a bad retention, or an output with a format-1 commit log)",
    5: "the output cannot be used or the storage failed",
}
HOUSEKEEPING_KEYS = {"application", "retention"}
MATERIALIZE_KEYS = {"application", "to", "format", "catalog"}
MATERIALIZE_FORMATS = ("parquet", "delta", "iceberg")
SNAPSHOT_KEYS = {"application", "parallelism"}
CONFIG = "var.json.pgpoll_ingest"
ERROR_PREFIXES = ("error:", "unexpected error:", "fix:")


LINEAGE_PARENT_ENV = ("OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID")


def lineage_parent_env(task_instance: Any) -> dict[str, str]:
    """This task's run as the parent of pgpoll's run: ``OPENLINEAGE_PARENT_ID`` and ``OPENLINEAGE_ROOT_PARENT_ID``.

    Rendered by the OpenLineage provider's own macros (``{namespace}/{job name}/{run id}``, the ids its
    listener gives the task and the DAG run), so Marquez or any lineage backend links the task to the
    pgpoll run it started. Empty where the provider is not installed or lineage is disabled. The provider's
    ``spark_inject_parent_job_info`` adds the same as ``spark.openlineage.parent*`` properties, which
    pgpoll reads too; the environment reaches the driver in every deploy mode and without a SparkSession.
    """
    try:
        from airflow.providers.openlineage import conf as ol_conf
        from airflow.providers.openlineage.plugins import macros
    except ImportError:
        return {}
    try:
        if ol_conf.is_disabled():
            return {}
        env = {"OPENLINEAGE_PARENT_ID": str(macros.lineage_parent_id(task_instance))}
        root = getattr(macros, "lineage_root_parent_id", None)  # provider 2.3.0 and later
        if root is not None:
            env["OPENLINEAGE_ROOT_PARENT_ID"] = str(root(task_instance))
        return env
    except Exception:  # lineage never fails the task: the run goes on without a parent
        return {}


def parse_summary(line: str) -> dict[str, Any] | None:
    """pgpoll's ingest run summary if ``line`` is one, else None."""
    obj = _json_object(line)
    return obj if obj is not None and "status" in obj and "slot" in obj and "exit_code" in obj else None


def parse_snapshot_summary(line: str) -> dict[str, Any] | None:
    """pgpoll snapshot's summary line (``status``, ``exit_code``, tables, chunks, rows...) if ``line`` is one."""
    obj = _json_object(line)
    return obj if obj is not None and "status" in obj and "exit_code" in obj else None


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


def _section(value: Any, name: str, allowed: set[str]) -> dict[str, Any] | None:
    """The Variable's object ``name`` (rendered with ``| tojson``) or None; another type or an unknown key fails."""
    config = _rendered_json(value, name)
    if config is None:
        return None
    if not isinstance(config, dict):
        raise AirflowFailException(f"Variable pgpoll_ingest: {name} must be an object, not {config!r}")
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise AirflowFailException(
            f"Variable pgpoll_ingest: unknown key(s) {unknown} in {name} (allowed: {sorted(allowed)})"
        )
    return config


def _with_options(args: Sequence[str], options: Mapping[str, str | None]) -> list[str]:
    """``args`` with each flag of ``options`` and its value removed, then the flags that have a value appended.

    Removing first makes a second ``execute()`` on the same object (a retry) give the same command.
    """
    out = list(args)
    for flag in options:
        while flag in out:
            at = out.index(flag)
            del out[at:at + 2]
    for flag, value in options.items():
        if value:
            out += [flag, value]
    return out


class _WatchedSparkSubmit(SparkSubmitOperator):  # type: ignore[misc]  # (Airflow is not where mypy runs: Any)
    """Feeds every line spark-submit prints (which the hook logs) to :meth:`_line`, keeps pgpoll's error lines,
    and maps the exit code: 3 skipped, ``not_retried`` failed at once, anything else raised for a retry."""

    what = "pgpoll"
    busy = "busy"
    not_retried: ClassVar[dict[int, str]] = {}
    # SparkSubmitOperator's, set again in execute() from the rendered configuration (typed here for mypy)
    application: str | None
    application_args: list[str] | None
    env_vars: dict[str, Any] | None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.errors: list[str] = []
        self._lineage_env: dict[str, str] = {}  # the parent run's variables this operator added (not the user's)

    def _line(self, line: str) -> None:
        raise NotImplementedError

    def _watch(self, lines: Iterator[Any]) -> Iterator[Any]:
        for line in lines:
            text = str(line)
            if text.lstrip().startswith(ERROR_PREFIXES):
                self.errors.append(text.strip())
            else:
                self._line(text)
            yield line

    def _get_hook(self) -> Any:
        hook = super()._get_hook()
        process_log = hook._process_spark_submit_log  # the provider's log reader; it keeps no lines
        hook._process_spark_submit_log = lambda itr: process_log(self._watch(itr))
        return hook

    def _exit_code(self) -> int | None:
        """spark-submit's exit code (the driver's in client and local mode)."""
        process = getattr(self._hook, "_submit_sp", None) if self._hook is not None else None
        return process.returncode if process is not None else None

    def _failed(self, context: Any) -> None:
        """Called when spark-submit failed, before its exit code is mapped."""

    def _submit(self, context: Any) -> None:
        self.errors = []
        env = {k: v for k, v in (self.env_vars or {}).items() if k not in self._lineage_env}  # a retry's own
        self._lineage_env = {k: v for k, v in lineage_parent_env(context.get("ti")).items() if k not in env}
        self.env_vars = {**env, **self._lineage_env} or None
        try:
            super().execute(context)
        except AirflowException as exc:
            self._failed(context)
            code = self._exit_code()
            detail = f": {' '.join(self.errors)}" if self.errors else ""
            if code == SLOT_BUSY:
                raise AirflowSkipException(f"{self.what}: {self.busy} (exit 3){detail}") from exc
            if code in self.not_retried:
                raise AirflowFailException(f"{self.what} exited {code}: {self.not_retried[code]}{detail}") from exc
            raise


class _SummarizedSparkSubmit(_WatchedSparkSubmit):
    """A job that prints one JSON summary line: it is the XCom ``return_value``, or ``summary`` on a skip or
    failure, and its ``exit_code`` is the one mapped (spark-submit's own where there is none)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.summary: dict[str, Any] | None = None

    def _parse(self, line: str) -> dict[str, Any] | None:
        return parse_summary(line)

    def _line(self, line: str) -> None:
        found = self._parse(line)
        if found is not None:
            self.summary = found

    def _exit_code(self) -> int | None:
        code = self.summary.get("exit_code") if self.summary else None
        return code if isinstance(code, int) else super()._exit_code()

    def _failed(self, context: Any) -> None:
        if self.summary is not None:
            context["ti"].xcom_push(key="summary", value=self.summary)

    def _submit(self, context: Any) -> None:
        self.summary = None
        super()._submit(context)


class PgpollIngestOperator(_SummarizedSparkSubmit):
    """``spark-submit`` of pgpoll's ingest job: summary to XCom, exit 3 skipped, exits 2 and 6 not retried.

    ``typed_tables`` (templated) renders to JSON ``true`` or ``false``; true adds ``--typed-tables``.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "typed_tables")
    busy = "the slot is busy; another run holds it"
    not_retried = NOT_RETRIED

    def __init__(self, *, typed_tables: str = "false", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.typed_tables = typed_tables

    def execute(self, context: Any) -> dict[str, Any] | None:
        typed = _rendered_json(self.typed_tables, "typed_tables")
        if not isinstance(typed, bool):
            raise AirflowFailException(f"Variable pgpoll_ingest: typed_tables must be true or false, not {typed!r}")
        args = [a for a in self.application_args or [] if a != "--typed-tables"]
        self.application_args = [*args, "--typed-tables"] if typed else args
        self._submit(context)
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
    what = "pgpoll materialize"
    busy = "another run is writing the destination"
    not_retried = MATERIALIZE_NOT_RETRIED

    def __init__(self, *, materialize: str = "null", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.materialize = materialize
        self.tables: list[dict[str, Any]] = []

    def _line(self, line: str) -> None:
        found = parse_table_state(line)
        if found is not None:
            self.tables.append(found)

    def _configure(self) -> None:
        config = _section(self.materialize, "materialize", MATERIALIZE_KEYS)
        if config is None:
            raise AirflowSkipException("materialize is not configured (no \"materialize\" in Variable pgpoll_ingest)")
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
        catalog = config.get("catalog")
        if catalog is not None and (fmt != "iceberg" or not isinstance(catalog, str) or not catalog):
            raise AirflowFailException(
                f"Variable pgpoll_ingest: materialize.catalog (a catalog name) goes with format iceberg only, not {catalog!r}"
            )
        self.application = application
        self.application_args = _with_options(self.application_args or [], {"--to": to, "--format": fmt,
                                                                             "--catalog": catalog})

    def execute(self, context: Any) -> list[dict[str, Any]]:
        self.tables = []
        self._configure()
        self._submit(context)
        for table in self.tables:
            for warning in table.get("warnings") or []:
                self.log.warning("pgpoll materialize: %s", warning)
        return self.tables


class PgpollSnapshotOperator(_SummarizedSparkSubmit):
    """``spark-submit`` of pgpoll's snapshot job: summary to XCom, exit 3 skipped, exits 2 and 5 not retried.

    Templated: ``snapshot`` renders to the JSON of the Variable's ``snapshot``
    object or ``null`` (application and parallelism), ``publication`` and
    ``tables`` to strings; each adds its flag only when set. ``application``
    is the ingest job's: ``snapshot.py`` beside it is the default.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "snapshot", "publication", "tables")
    what = "pgpoll snapshot"
    busy = "a snapshot of one of these tables is already running"
    not_retried = SNAPSHOT_NOT_RETRIED

    def __init__(self, *, snapshot: str = "null", publication: str = "", tables: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot, self.publication, self.tables = snapshot, publication, tables

    def _parse(self, line: str) -> dict[str, Any] | None:
        return parse_snapshot_summary(line)

    def _configure(self) -> None:
        config = _section(self.snapshot, "snapshot", SNAPSHOT_KEYS) or {}
        folder, slash, ingest_app = str(self.application or "").rpartition("/")
        application = config.get("application", f"{folder}{slash}snapshot.py" if ingest_app else None)
        if not isinstance(application, str) or not application:
            raise AirflowFailException(
                "Variable pgpoll_ingest: snapshot.application (the path of snapshot.py) is required "
                "when there is no ingest application to find it beside"
            )
        parallelism = config.get("parallelism")
        if parallelism is not None and (type(parallelism) is not int or parallelism < 1):
            raise AirflowFailException(
                f"Variable pgpoll_ingest: snapshot.parallelism must be a positive integer, not {parallelism!r}"
            )
        tables = ",".join(t.strip() for t in str(self.tables or "").split(",") if t.strip())
        self.application = application
        self.application_args = _with_options(self.application_args or [], {
            "--publication": str(self.publication or "").strip(),
            "--tables": tables,
            "--parallelism": str(parallelism) if parallelism is not None else None,
        })

    def execute(self, context: Any) -> dict[str, Any] | None:
        self._configure()
        self._submit(context)
        if self.summary is None:
            self.log.warning("pgpoll snapshot succeeded but printed no summary line")
        return self.summary


class PgpollHousekeepingOperator(_SummarizedSparkSubmit):
    """``spark-submit`` of pgpoll's housekeeping job (compact, then retain): summary to XCom, exit 3 skipped,
    exits 2 and 5 not retried.

    ``housekeeping`` (templated) renders to the JSON of the Variable's
    ``housekeeping`` object or ``null``: ``retention`` (``7d``...; absent:
    the job's ``PGPOLL_RETENTION``, else off) and ``application``
    (default: ``housekeeping.py`` beside the ingest job's application).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "housekeeping")
    what = "pgpoll housekeeping"
    busy = "another retain (or compact) run holds the output"
    not_retried = HOUSEKEEPING_NOT_RETRIED

    def __init__(self, *, housekeeping: str = "null", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.housekeeping = housekeeping

    def _parse(self, line: str) -> dict[str, Any] | None:
        return parse_snapshot_summary(line)

    def execute(self, context: Any) -> dict[str, Any] | None:
        config = _section(self.housekeeping, "housekeeping", HOUSEKEEPING_KEYS) or {}
        folder, slash, ingest_app = str(self.application or "").rpartition("/")
        application = config.get("application", f"{folder}{slash}housekeeping.py" if ingest_app else None)
        retention = config.get("retention")
        if not isinstance(application, str) or not application:
            raise AirflowFailException("Variable pgpoll_ingest: housekeeping.application (the path of "
                                       "housekeeping.py) is required when there is no ingest application")
        if retention is not None and (not isinstance(retention, str) or not retention):
            raise AirflowFailException(f"Variable pgpoll_ingest: housekeeping.retention must be like 7d, not {retention!r}")
        self.application = application
        self.application_args = _with_options(self.application_args or [], {"--retention": retention})
        self._submit(context)
        return self.summary


def spark_task_args(**kwargs: Any) -> dict[str, Any]:
    """The arguments every task shares: the Spark connection, ``py_files``, no console progress bar."""
    return {
        "conn_id": "pgpoll_spark",
        "py_files": "{{ %s.get('py_files', '') }}" % CONFIG,
        "conf": {"spark.ui.showConsoleProgress": "false"},
        **kwargs,
    }


# The source's DSN, password included, in the job's environment (never on its command line).
SOURCE_ENV = {"PGPOLL_DSN": "{{ conn.pgpoll_source.get_uri() }}"}
RETRIES = {
    "retries": 4,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=30),
}
