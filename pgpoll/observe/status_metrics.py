"""``pgpoll status --format prometheus``: the slot and output gauges in Prometheus's text format.

The text exposition format 0.0.4, which node_exporter's textfile collector reads (it does not read
OpenMetrics): a cron job writes it to ``*.prom`` (through a temporary file and a rename) and node_exporter
serves it. Each alert of :mod:`pgpoll.status` is a 0/1 series, so a rule can fire on it and a panel can show
it; the output's position is a state set (1 for the current position, 0 for the others).
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from pgpoll.observe.metric_families import registry_of
from pgpoll.observe.metrics import ALERTS, BY_NAME, POSITIONS, output_label
from pgpoll.status import StatusReport


def _gauge(name: str) -> GaugeMetricFamily:
    spec = BY_NAME[name]
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


def status_families(report: StatusReport) -> list[Metric]:
    """The gauges of every slot in ``report`` (and of its output, when the report has one)."""
    names = ("pgpoll_slot_lag_bytes", "pgpoll_slot_lag_seconds", "pgpoll_slot_safe_wal_size_bytes",
             "pgpoll_slot_active", "pgpoll_slot_alert", "pgpoll_status_timestamp_seconds",
             "pgpoll_output_position", "pgpoll_output_position_bytes")
    fam = {name: _gauge(name) for name in names}
    for s in report.slots:
        slot = s.info.name
        if s.info.lag_bytes is not None:
            fam["pgpoll_slot_lag_bytes"].add_metric([slot], s.info.lag_bytes)
        if s.lag_seconds is not None:
            fam["pgpoll_slot_lag_seconds"].add_metric([slot], s.lag_seconds)
        if s.info.safe_wal_size is not None:
            fam["pgpoll_slot_safe_wal_size_bytes"].add_metric([slot], s.info.safe_wal_size)
        fam["pgpoll_slot_active"].add_metric([slot], 1 if s.info.active else 0)
        for alert in ALERTS:
            fam["pgpoll_slot_alert"].add_metric([slot, alert], 1 if alert in s.alerts else 0)
        fam["pgpoll_status_timestamp_seconds"].add_metric([slot], s.checked_at.timestamp())
        if s.output is not None:
            output = output_label(s.output.output)
            for position in POSITIONS:
                fam["pgpoll_output_position"].add_metric([slot, output, position], 1 if s.position == position else 0)
            if s.position_bytes is not None:
                fam["pgpoll_output_position_bytes"].add_metric([slot, output], s.position_bytes)
    return [f for f in fam.values() if f.samples]


def status_text(report: StatusReport) -> str:
    """``report`` in the Prometheus text format (0.0.4)."""
    return generate_latest(registry_of(status_families(report))).decode("utf-8")
