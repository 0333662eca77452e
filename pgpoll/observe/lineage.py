"""OpenLineage events for each run of ingest, snapshot and materialize: START, then COMPLETE, FAIL or ABORT.

The jobs' library functions are wrapped with :func:`observed` (``@observed("ingest")``), so the CLI and the
``spark-submit`` jobs emit alike. Configured the client's usual way, nothing of pgpoll's own:
``OPENLINEAGE_URL`` (with ``OPENLINEAGE_ENDPOINT``, ``OPENLINEAGE_API_KEY``), an ``openlineage.yml``
(``OPENLINEAGE_CONFIG``, the working directory, ``~/.openlineage/``), or ``OPENLINEAGE__TRANSPORT__*``
variables; ``OPENLINEAGE_DISABLED=true`` turns it off. ``OPENLINEAGE_NAMESPACE`` is the jobs' namespace
(default ``pgpoll``).

Why pgpoll checks the configuration before it builds a client: unconfigured, ``OpenLineageClient()``
falls back to its console transport (and warns), and pgpoll's stdout carries the JSON summary line that
Airflow reads; so without a configuration pgpoll builds no client and sends nothing. The client also
writes aliases of ``OPENLINEAGE_URL`` into ``os.environ`` while it is built; they are taken out again.

Lineage never decides a run's outcome: a transport that fails (a lineage server down, a timeout) is one
warning on stderr, and the run's result and exit code are what they would have been without it. The
events carry no secret: datasets are named by host, port and database (never a user or password), and a
``FAIL`` event's message is redacted as pgpoll's error lines are.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pgpoll.errors import PgpollError

log = logging.getLogger("pgpoll.observe")
P = ParamSpec("P")
R = TypeVar("R")
JOB_NAMESPACE_ENV = "OPENLINEAGE_NAMESPACE"
DEFAULT_JOB_NAMESPACE = "pgpoll"


def configured(env: Mapping[str, str] | None = None, cwd: Path | None = None, home: Path | None = None) -> bool:
    """True when the OpenLineage client would find a transport of its own (not its console fallback)."""
    env = os.environ if env is None else env
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OPENLINEAGE_URL") or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env):
        return True
    files = [Path(env["OPENLINEAGE_CONFIG"])] if env.get("OPENLINEAGE_CONFIG") else []
    files += [(cwd or Path.cwd()) / "openlineage.yml", (home or Path.home()) / ".openlineage" / "openlineage.yml"]
    return any(f.is_file() for f in files)


def _client() -> Any:
    """The client, or None when its configuration names no transport (it would print to the console)."""
    from openlineage.client import OpenLineageClient

    saved = dict(os.environ)
    try:
        client = OpenLineageClient()
    finally:  # the client writes OPENLINEAGE__TRANSPORT__* aliases of OPENLINEAGE_URL into the environment
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)
    kind = getattr(client.transport, "kind", None)
    if kind == "console" and not (client.config.transport or {}).get("type"):
        return None
    return None if kind == "noop" else client


def _spark_conf(spark: Any) -> dict[str, str] | None:
    """The ``spark.openlineage.*`` properties: of ``spark``, or of the JVM ``spark-submit`` started (no new JVM)."""
    try:
        if spark is not None:
            pairs = spark.sparkContext.getConf().getAll()
        elif os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit: its JVM runs; connect, start nothing
            from pyspark import SparkConf, SparkContext

            SparkContext._ensure_initialized()  # no public way to reach the submitted JVM's properties
            pairs = SparkConf().getAll()
        else:
            return None
    except Exception as exc:  # (lineage never fails a run)
        log.debug("lineage: Spark properties not read: %s", exc)
        return None
    return {str(k): str(v) for k, v in pairs if str(k).startswith("spark.openlineage.")}


def _error_text(exc: BaseException) -> str:
    from pgpoll.source.connection import redact

    if isinstance(exc, PgpollError):
        text = exc.message + (f"\nfix: {exc.hint}" if exc.hint else "")
    else:
        text = f"{type(exc).__name__}: {exc}"
    return redact(text)


class RunEmitter:
    """One run's events: the description is read at the start and again at the end (new tables appear)."""

    def __init__(self, client: Any, job: str, opts: Any, spark: Any) -> None:
        from openlineage.client.uuid import generate_new_uuid

        from pgpoll.observe.lineage_names import location, parent_run

        self.client, self.job, self.opts = client, job, opts
        self.cache: dict[str, Any] = {}  # what is read once per run (the publications' tables)
        self.run_id = str(generate_new_uuid())
        self.parent = parent_run(os.environ, _spark_conf(spark))
        self.namespace = os.environ.get(JOB_NAMESPACE_ENV) or DEFAULT_JOB_NAMESPACE
        subject = getattr(opts, "slot", None) or location(opts.output)[1].rsplit("/", 1)[-1]
        self.name = f"pgpoll.{job}.{subject}"

    def _describe(self, result: Any) -> Any:
        from pgpoll.observe import lineage_datasets as datasets
        from pgpoll.observe.lineage_events import RunLineage

        describe = {"ingest": datasets.ingest_datasets, "snapshot": datasets.snapshot_datasets,
                    "materialize": datasets.materialize_datasets}[self.job]
        inputs, outputs = describe(self.opts, result, self.cache)
        return RunLineage(self.job, self.namespace, self.name, self.run_id, inputs, outputs, self.parent)

    def emit(self, event_type: str, result: Any = None, error: BaseException | None = None) -> None:
        """Send one event; any failure (describing or sending) is a warning."""
        from pgpoll.observe.lineage_events import build_event

        try:
            event = build_event(self._describe(result), event_type, datetime.now(UTC),
                                _error_text(error) if error is not None else None)
            self.client.emit(event)
        except Exception as exc:  # (a lineage server down never changes a run's outcome)
            from pgpoll.source.connection import redact

            log.warning("OpenLineage %s event of the %s run not sent: %s", event_type, self.job, redact(str(exc)))


def _outcome(result: Any) -> str:
    """COMPLETE, or ABORT for a run that was stopped (a summary with status "interrupted")."""
    return "ABORT" if getattr(result, "status", "ok") == "interrupted" else "COMPLETE"


def observed(job: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a job's run function (its first argument the options, ``spark`` its second or a keyword) to emit
    START before it and COMPLETE, ABORT or FAIL after it, when OpenLineage is configured."""

    def wrap(run: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(run)
        def observed_run(*args: P.args, **kwargs: P.kwargs) -> R:
            emitter = None
            if configured():
                try:
                    client = _client()
                    spark = kwargs.get("spark", args[1] if len(args) > 1 else None)
                    emitter = RunEmitter(client, job, args[0], spark) if client is not None else None
                except Exception as exc:  # (a bad lineage configuration never fails a run)
                    log.warning("OpenLineage is configured but its client could not be built: %s", exc)
            if emitter is None:
                return run(*args, **kwargs)
            emitter.emit("START")
            try:
                result = run(*args, **kwargs)
            except BaseException as exc:
                emitter.emit("FAIL", error=exc)
                raise
            emitter.emit(_outcome(result), result=result)
            return result

        return observed_run

    return wrap
