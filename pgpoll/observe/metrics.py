"""pgpoll's Prometheus metrics: the one registry of their names (the reference, rules and dashboard check against
it), and the metric families of a run and of ``pgpoll status``.

Prometheus's conventions (https://prometheus.io/docs/practices/naming/): a ``pgpoll_`` prefix, base units
(seconds, bytes) named in the name, ``_total`` for counters, timestamps as Unix seconds in gauges named
``..._timestamp_seconds``. A run's metrics are pushed to a Pushgateway (:mod:`pgpoll.observe.push`), which adds
the grouping labels ``job``, ``slot`` and ``output`` to each; ``pgpoll status --format prometheus`` prints the
slot and output gauges for node_exporter's textfile collector. The families are built here from values alone
(custom collectors, no client-side state): nothing else is exported (no process metrics) and counters carry
no ``_created`` series.

Labels never hold a secret: an output URL loses its user, password and query string (:func:`output_label`),
and no DSN is ever a label.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pgpoll.observe.run_history import History, RunRecord

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
            "slot_ahead_of_output), else 0.", ("slot", "alert")),
    _status("pgpoll_status_timestamp_seconds", "When pgpoll status read the server (Unix time, the server's clock)."),
    _status("pgpoll_output_position", "The output against the slot: 1 for the current position (in_sync, "
            "slot_behind_output, slot_ahead_of_output, no_commits), 0 for the others.", ("slot", "output", "position")),
    _status("pgpoll_output_position_bytes", "The slot's confirmed position minus the output's high-water mark "
            "(negative: the slot is behind the output).", ("slot", "output")),
)

BY_NAME = {m.name: m for m in METRICS}


def output_label(output: str) -> str:
    """``output`` as a label: a URL without user, password, query or fragment; a local path as given."""
    parts = urlsplit(output)
    if not parts.scheme or not parts.netloc:
        return output
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _family(name: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily | CounterMetricFamily:
    spec = BY_NAME[name]
    if spec.kind == "counter":
        return CounterMetricFamily(name, spec.help, labels=list(labels))
    return GaugeMetricFamily(name, spec.help, labels=list(labels))


def _gauge(name: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        family = _family(name)
        family.add_metric([], float(value))
        yield family


def run_families(record: RunRecord, history: History | None) -> list[Metric]:
    """The metrics of the run that just ended, with the totals and last success/failure of ``history``
    (the output's run history including this run; None when it could not be read: then only this run's)."""
    out: list[Metric] = []
    out += _gauge("pgpoll_last_run_timestamp_seconds", record.ended.timestamp())
    out += _gauge("pgpoll_last_run_duration_seconds", record.seconds)
    out += _gauge("pgpoll_last_run_exit_code", record.exit_code)
    out += _gauge("pgpoll_last_run_success", 1 if record.succeeded else 0)
    out += _gauge("pgpoll_last_run_batches", record.batches)
    out += _gauge("pgpoll_last_run_changes", record.changes)
    out += _gauge("pgpoll_last_run_written_bytes", record.bytes)
    out += _gauge("pgpoll_last_run_lag_bytes", record.lag_bytes)
    success = record if record.succeeded else (history.last(record.job, succeeded=True) if history else None)
    failure = (history.last(record.job, succeeded=False) if history else None) if record.succeeded else record
    if success is not None:
        out += _gauge("pgpoll_last_success_timestamp_seconds", success.ended.timestamp())
    if failure is not None and failure.status != "interrupted":
        out += _gauge("pgpoll_last_failure_timestamp_seconds", failure.ended.timestamp())
    totals = history.totals.get(record.job) if history is not None else None
    if totals is not None:
        runs = _family("pgpoll_runs_total", ("outcome",))
        ok = totals.runs - totals.failures - totals.interrupted
        for outcome, count in zip(OUTCOMES, (ok, totals.failures, totals.interrupted), strict=True):
            runs.add_metric([outcome], count)
        out.append(runs)
        for name, value in (("pgpoll_batches_total", totals.batches), ("pgpoll_changes_total", totals.changes),
                            ("pgpoll_written_bytes_total", totals.bytes)):
            family = _family(name)
            family.add_metric([], value)
            out.append(family)
    return out


class Families(Collector):
    """A collector that yields fixed metric families (built once, from values)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return iter(self.families)


def registry_of(families: Iterable[Metric]) -> CollectorRegistry:
    """A registry holding just ``families`` (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    return registry
