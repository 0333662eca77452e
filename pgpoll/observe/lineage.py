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
warning on stderr, and costs the run little: the client's HTTP transports retry five times with back-off by
default (about nine seconds per event to a closed port, so a run's START and COMPLETE held it ~18 s), so an
HTTP transport whose configuration sets no ``retry`` (or ``timeout``) gets pgpoll's: no retry, a 5 s timeout
(:func:`with_defaults`; the user's ``openlineage.yml`` or ``OPENLINEAGE__TRANSPORT__*`` keys win).
The run's result and exit code are what they would have been without it. The
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
HTTP_TIMEOUT = 5.0
"""Seconds an HTTP transport waits for the lineage server, unless its configuration says (``timeout``)."""
HTTP_RETRY: dict[str, Any] = {"total": 0}
"""No retry unless the configuration says (``retry``): a run is not held for a lineage server that is down."""
HTTP_KINDS = ("http", "async_http")


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


def with_defaults(transport: Mapping[str, Any]) -> dict[str, Any]:
    """A transport's configuration (the client's ``transport:`` mapping) with pgpoll's ``timeout`` and ``retry``
    in each HTTP transport that sets none, a composite's included; other transports as they are. The client
    merges a ``retry`` mapping over its own defaults, so ``{"total": 0}`` alone means no retry."""
    conf = dict(transport)
    kind = conf.get("type")
    if kind in HTTP_KINDS:
        return {"timeout": HTTP_TIMEOUT, "retry": dict(HTTP_RETRY), **conf}
    inner = conf.get("transports")
    if kind == "composite" and isinstance(inner, dict):
        conf["transports"] = {name: with_defaults(c) if isinstance(c, Mapping) else c for name, c in inner.items()}
    elif kind == "composite" and isinstance(inner, list):
        conf["transports"] = [with_defaults(c) if isinstance(c, Mapping) else c for c in inner]
    return conf


def _url_transport(env: Mapping[str, str]) -> dict[str, Any]:
    """The transport the client builds from ``OPENLINEAGE_URL`` (with ``_ENDPOINT``, ``_API_KEY``), as a mapping."""
    conf: dict[str, Any] = {"type": "http", "url": env["OPENLINEAGE_URL"],
                            "endpoint": env.get("OPENLINEAGE_ENDPOINT", "api/v1/lineage")}
    if env.get("OPENLINEAGE_API_KEY"):
        conf["auth"] = {"type": "api_key", "apiKey": env["OPENLINEAGE_API_KEY"]}
    return conf


def _client() -> Any:
    """The client, or None when its configuration names no transport (it would print to the console).

    The client reads its configuration itself; its transport is then built again, by the client's factory,
    from that configuration completed by :func:`with_defaults` (the client has no layer below the user's)."""
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport import get_default_factory

    saved = dict(os.environ)
    try:
        client = OpenLineageClient()
    finally:  # the client writes OPENLINEAGE__TRANSPORT__* aliases of OPENLINEAGE_URL into the environment
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)
    kind = getattr(client.transport, "kind", None)
    conf = client.config.transport or {}
    if kind == "console" and not conf.get("type"):
        return None
    if kind == "noop":
        return None
    if conf.get("type"):  # openlineage.yml or OPENLINEAGE__TRANSPORT__*: what the client built it from
        wanted = with_defaults(conf)
        if wanted != conf:
            client.transport = get_default_factory().create(wanted)
    elif kind == "http" and os.environ.get("OPENLINEAGE_URL"):  # the client's plain OPENLINEAGE_URL form
        client.transport = get_default_factory().create(with_defaults(_url_transport(os.environ)))
    return client


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


def _raised_outcome(error: BaseException, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """FAIL, or ABORT for a run a stop cut short: the stop's own error (or Ctrl-C's), or any error raised once
    the run's :class:`~pgpoll.stopping.StopRequest` was set (the signal cut a step short), as
    :func:`pgpoll.observe.runs.run_ended` records it ("interrupted")."""
    from pgpoll.stopping import StopRequest, StopRequestedError

    if isinstance(error, StopRequestedError | KeyboardInterrupt):
        return "ABORT"
    stops = [a for a in (*args, *kwargs.values()) if isinstance(a, StopRequest)]
    return "ABORT" if any(s.requested for s in stops) else "FAIL"


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
                outcome = _raised_outcome(exc, args, kwargs)
                emitter.emit(outcome, error=exc if outcome == "FAIL" else None)
                raise
            emitter.emit(_outcome(result), result=result)
            return result

        return observed_run

    return wrap
