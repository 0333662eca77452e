"""pgpoll's Prometheus metrics: the one registry of their names (the reference, rules and dashboard check against
it); the metric families of a run are built by :mod:`pgpoll.observe.metric_families`, those of ``pgpoll status``
by :mod:`pgpoll.observe.status_metrics`.

Prometheus's conventions (https://prometheus.io/docs/practices/naming/): a ``pgpoll_`` prefix, base units
(seconds, bytes) named in the name, ``_total`` for counters, timestamps as Unix seconds in gauges named
``..._timestamp_seconds``. A run's metrics are pushed to a Pushgateway (:mod:`pgpoll.observe.runs`), which adds
the grouping labels ``job``, ``slot`` and ``output`` to each; ``pgpoll status --format prometheus`` prints the
slot and output gauges for node_exporter's textfile collector. The families are built from values alone
(custom collectors, no client-side state): nothing else is exported (no process metrics) and counters carry
no ``_created`` series.

This module imports no ``prometheus_client`` (about a tenth of a second): every run imports it, and only a
run that pushes, or ``pgpoll status --format prometheus``, needs the client.

Labels never hold a secret: an output URL loses its user, password and query string (:func:`output_label`),
and no DSN is ever a label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urlsplit, urlunsplit

Kind = Literal["gauge", "counter"]
Source = Literal["run", "status"]

#: the grouping labels of every pushed metric (``slot`` absent for materialize, which reads an output, not a slot)
PUSH_LABELS = ("job", "slot", "output")


@dataclass(frozen=True)
class MetricSpec:
    """One metric pgpoll emits: its name, type, labels (beyond the push grouping), where it comes from, and help."""

    name: str
    kind: Kind
    help: str
    source: Source
    labels: tuple[str, ...] = ()


def _run(name: str, kind: Kind, text: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, text, "run", labels)


def _status(name: str, text: str, labels: tuple[str, ...] = ("slot",)) -> MetricSpec:
    return MetricSpec(name, "gauge", text, "status", labels)


OUTCOMES = ("ok", "failed", "interrupted")
ALERTS = ("lost", "unreserved", "lag", "slot_ahead_of_output", "other_server", "timeline_diverged",
          "timeline_unverified")
POSITIONS = ("in_sync", "slot_behind_output", "slot_ahead_of_output", "no_commits", "other_server", "timeline_diverged",
             "timeline_unverified")

METRICS: tuple[MetricSpec, ...] = (
    _run("pgpoll_last_run_timestamp_seconds", "gauge", "When the last run ended (Unix time)."),
    _run("pgpoll_last_run_duration_seconds", "gauge", "How long the last run took."),
    _run("pgpoll_last_run_exit_code", "gauge", "The last run's exit code (0 ok, 3 busy, 4 source, 5 sink, 130/143 "
         "interrupted; see the exit codes)."),
    _run("pgpoll_last_run_success", "gauge", "1 when the last run succeeded, else 0."),
    _run("pgpoll_last_success_timestamp_seconds", "gauge", "When the last successful run ended (Unix time); a failed "
         "run leaves it as it was."),
    _run("pgpoll_last_failure_timestamp_seconds", "gauge", "When the last failed run ended (Unix time)."),
    _run("pgpoll_last_run_batches", "gauge", "Batches the last run committed."),
    _run("pgpoll_last_run_changes", "gauge", "Changes (ingest) or rows (snapshot, materialize) of the last run."),
    _run("pgpoll_last_run_written_bytes", "gauge", "Bytes of Parquet the last run committed."),
    _run("pgpoll_last_run_lag_bytes", "gauge", "ingest: WAL the slot was behind at the run's end (what the next run "
         "reads)."),
    _run("pgpoll_runs_total", "counter", "Runs of this job on this output, by outcome (ok, failed, interrupted), from "
         "the run history.", ("outcome",)),
    _run("pgpoll_batches_total", "counter", "Batches committed by this job on this output, from the run history."),
    _run("pgpoll_changes_total", "counter", "Changes (or rows) written by this job on this output, from the run "
         "history."),
    _run("pgpoll_written_bytes_total", "counter", "Bytes committed by this job on this output, from the run history."),
    _status("pgpoll_slot_lag_bytes", "WAL written since the slot's confirmed position: what the next run reads."),
    _status("pgpoll_slot_lag_seconds", "With --output: 0 when nothing is pending, else an upper bound of the oldest "
            "pending change's age."),
    _status("pgpoll_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is in danger of losing "
            "WAL (absent when unlimited)."),
    _status("pgpoll_slot_active", "1 when a process is consuming the slot now."),
    _status("pgpoll_slot_alert", "1 when the alert holds (lost, unreserved, lag above --max-lag-bytes, "
            "slot_ahead_of_output, other_server, timeline_diverged), else 0.", ("slot", "alert")),
    _status("pgpoll_status_timestamp_seconds", "When pgpoll status read the server (Unix time, the server's clock)."),
    _status("pgpoll_output_position", "The output against the slot: 1 for the current position (in_sync, "
            "slot_behind_output, slot_ahead_of_output, no_commits), 0 for the others.", ("slot", "output", "position")),
    _status("pgpoll_output_position_bytes", "The slot's confirmed position minus the output's high-water mark "
            "(negative: the slot is behind the output).", ("slot", "output")),
)

BY_NAME = {m.name: m for m in METRICS}


def public_netloc(parts: SplitResult) -> str:
    """``parts``'s host and port without user or password; an IPv6 host keeps its brackets (``[::1]:9091``:
    ``hostname`` drops them, and ``::1:9091`` is no address)."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port else host


def output_label(output: str) -> str:
    """``output`` as a label: a URL without user, password, query or fragment; a local path as given."""
    parts = urlsplit(output)
    if not parts.scheme or not parts.netloc:
        return output
    return urlunsplit((parts.scheme, public_netloc(parts), parts.path, "", ""))
