"""The metric families of a run that just ended (what :mod:`pgpoll.observe.runs` pushes), built from values
with ``prometheus_client``'s custom-collector types; the names, types and help come from
:data:`pgpoll.observe.metrics.METRICS`.

Imported only where a push or the text format needs it (``prometheus_client`` costs about a tenth of a second
to import, on every run otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgpoll.observe.metrics import BY_NAME, OUTCOMES

if TYPE_CHECKING:
    from pgpoll.observe.run_history import History, RunRecord


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
