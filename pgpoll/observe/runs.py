"""A run's two hooks: :func:`run_started` at its start, :func:`run_ended` at its end (failed runs too).

``ingest``, ``snapshot`` and ``materialize`` call them in their library layer (``run_ingest``,
``run_snapshot``, ``run_materialize``), which the CLI and the ``spark-submit`` jobs both go through. At the
end of a run this records it in the output's run history (:mod:`pgpoll.observe.run_history`) and, with
``PGPOLL_PUSHGATEWAY`` (or ``--pushgateway``), pushes its metrics (:mod:`pgpoll.observe.metrics`) to a
Pushgateway, grouped by ``job`` (``pgpoll_ingest``...), ``slot`` and ``output``.

The Pushgateway way for batch jobs (https://prometheus.io/docs/practices/pushing/): a successful run
replaces its group (``PUT``: a metric a run no longer has goes); a failed or interrupted one adds to it
(``POST``, :func:`prometheus_client.pushadd_to_gateway`): only the metrics it pushes are replaced, so
``pgpoll_last_success_timestamp_seconds`` of the last success stays, as rules that alert on no success for
a while need. Neither the history nor the push may change a run's outcome: their failures are warnings.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pgpoll.cli.exitcodes import SLOT_BUSY, exit_code_for
from pgpoll.errors import SinkError
from pgpoll.observe.metrics import output_label, public_netloc
from pgpoll.observe.run_history import History, RunRecord, record_run
from pgpoll.sink import layout
from pgpoll.sink.stores.filesystem import needs_spark, open_output

log = logging.getLogger("pgpoll.observe")

PUSHGATEWAY_ENV = "PGPOLL_PUSHGATEWAY"
"""The Pushgateway's URL (``http://host:9091``; a user and password in it are sent as basic auth)."""
PUSH_TIMEOUT = 10.0


@dataclass(frozen=True)
class ObservedRun:
    """A run in progress: what it is, where it writes, when it started."""

    job: str
    output: str
    slot: str | None
    pushgateway: str | None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)


def run_started(job: str, *, output: str, slot: str | None = None, pushgateway: str | None = None) -> ObservedRun:
    """Note a run's start; ``pushgateway`` None: ``PGPOLL_PUSHGATEWAY`` (empty: no push)."""
    url = pushgateway if pushgateway is not None else os.environ.get(PUSHGATEWAY_ENV, "")
    return ObservedRun(job=job, output=output, slot=slot, pushgateway=url.strip() or None)


def run_ended(
    run: ObservedRun, *, status: str = "ok", exit_code: int = 0, error: BaseException | None = None,
    stopped: int | None = None, batches: int = 0, changes: int = 0, bytes_: int = 0, lag_bytes: int | None = None,
) -> RunRecord:
    """Record the run in the output's history and push its metrics; never raises. ``error``: the run raised it
    (its status and exit code then come from the error, as the CLI would map it); ``stopped``: a signal's exit
    code when a stop was requested (an error raised then is the signal cutting a step short: "interrupted")."""
    if error is not None:
        if stopped is not None or isinstance(error, KeyboardInterrupt):
            status, exit_code = "interrupted", stopped if stopped is not None else 130
        else:
            exit_code = exit_code_for(error)
            status = "busy" if exit_code == SLOT_BUSY else "error"
    record = RunRecord(
        run_id=run.run_id, job=run.job, started_at=run.started_at.isoformat(),
        ended_at=datetime.now(UTC).isoformat(), seconds=round(time.monotonic() - run.started, 3), status=status,
        exit_code=exit_code, slot=run.slot, batches=batches, changes=changes, bytes=bytes_, lag_bytes=lag_bytes,
        error=type(error).__name__ if error is not None else None,
    )
    # a run the output failed (exit 5: unreachable, a wrong secret) is not recorded there: the store would fail
    # the record too, after its patient retries, and hold the exit back
    history = None if isinstance(error, SinkError) else _record(run, record)
    if run.pushgateway:
        push_run(run.pushgateway, record, history, output=run.output)
    return record


def _record(run: ObservedRun, record: RunRecord) -> History | None:
    """Record the run; a failed run records only in an output that exists (a mistyped ``--output`` stays absent),
    and its history's problems are only debug lines (the store that failed the run fails this too)."""
    try:
        fs = open_output(run.output, _active_spark() if needs_spark(run.output) else None)
        if not record.succeeded and not fs.exists(fs.path(layout.META)):
            return None
        return record_run(fs, record)
    except Exception as exc:  # (an unreachable store, a Hadoop-only output: the run's outcome stands)
        level = logging.WARNING if record.succeeded else logging.DEBUG
        log.log(level, "could not record the run in %s's history: %s", output_label(run.output), _message(exc))
        return None


def _active_spark() -> Any:
    """The run's SparkSession, for an output only Hadoop reaches (None: it never started one)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__


def grouping_key(record: RunRecord, output: str) -> dict[str, str]:
    """The push's grouping labels beside ``job``: the slot (absent for materialize) and the output, secret-free."""
    key = {"output": output_label(output)}
    if record.slot:
        key["slot"] = record.slot
    return key


def push_target(url: str) -> tuple[str, str | None, str | None]:
    """The Pushgateway's URL without its credentials (what is requested and shown), and its user and password."""
    parts = urlsplit(url)
    if not parts.netloc:
        return url, None, None
    return urlunsplit((parts.scheme, public_netloc(parts), parts.path, "", "")), parts.username, parts.password


def push_run(url: str, record: RunRecord, history: History | None, *, output: str) -> bool:
    """Push ``record``'s metrics: ``PUT`` after a success with its history, else ``POST``; False (warned) on failure.

    ``prometheus_client`` is imported here, not with this module: a run without a Pushgateway never needs it."""
    from prometheus_client import push_to_gateway, pushadd_to_gateway
    from prometheus_client.exposition import basic_auth_handler, default_handler

    from pgpoll.observe.metric_families import registry_of, run_families

    shown, user, password = push_target(url)
    handler: Any = default_handler
    if user is not None:

        def with_auth(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                      data: bytes) -> Any:
            return basic_auth_handler(url, method, timeout, headers, data, user, password or "")

        handler = with_auth
    replace = record.succeeded and history is not None
    push = push_to_gateway if replace else pushadd_to_gateway
    try:
        push(shown, job=f"pgpoll_{record.job}", registry=registry_of(run_families(record, history)),
             grouping_key=grouping_key(record, output), timeout=PUSH_TIMEOUT, handler=handler)
    except Exception as exc:  # (a Pushgateway down or refusing: a warning, the exit code stands)
        log.warning("could not push the run's metrics to the Pushgateway %s: %s", shown, _message(exc))
        return False
    return True
