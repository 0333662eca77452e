"""The metric registry follows Prometheus's naming conventions; labels carry no secret; a run's families."""

from __future__ import annotations

import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgpoll.observe.metric_families import registry_of, run_families
from pgpoll.observe.metrics import METRICS, output_label
from pgpoll.observe.run_history import History, RunRecord, fold
from pgpoll.observe.runs import grouping_key

UNITS = ("_seconds", "_bytes", "_total", "_code", "_success", "_batches", "_changes", "_active", "_alert",
         "_position")


def test_names_follow_the_conventions() -> None:
    for spec in METRICS:
        assert re.fullmatch(r"pgpoll_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.name.endswith(UNITS), f"{spec.name}: no base unit or known suffix"
        assert "timestamp" not in spec.name or spec.name.endswith("_timestamp_seconds"), spec.name
        assert spec.help.endswith(".") and "DSN" not in spec.help
    assert len({m.name for m in METRICS}) == len(METRICS)


def test_an_output_url_loses_its_credentials_in_labels() -> None:
    assert output_label("s3://key:secret@bucket/lake/pg?versionId=1") == "s3://bucket/lake/pg"
    assert output_label("abfss://user:pw@container.dfs.core.windows.net:443/x") == (
        "abfss://container.dfs.core.windows.net:443/x")
    assert output_label("/data/out") == "/data/out"  # checkout-paths: data
    record = RunRecord(run_id="r", job="materialize", started_at="2026-01-01T00:00:00+00:00",
                       ended_at="2026-01-01T00:00:01+00:00", seconds=1.0, status="ok", exit_code=0)
    assert grouping_key(record, "gs://a:b@bucket/p") == {"output": "gs://bucket/p"}  # no slot: materialize


def test_a_failure_reports_the_last_success_from_the_history_and_counts_by_outcome() -> None:
    base = {"job": "ingest", "started_at": "2026-01-01T00:00:00+00:00", "seconds": 1.0, "slot": "s"}
    ok = RunRecord(run_id="1", ended_at="2026-01-01T00:00:01+00:00", status="ok", exit_code=0, changes=7, **base)
    stopped = RunRecord(run_id="2", ended_at="2026-01-01T00:00:02+00:00", status="interrupted", exit_code=143, **base)
    failed = RunRecord(run_id="3", ended_at="2026-01-01T00:00:03+00:00", status="error", exit_code=4, **base)
    text = generate_latest(registry_of(run_families(failed, fold(History(), [ok, stopped, failed])))).decode()
    samples = {(s.name, s.labels.get("outcome")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("pgpoll_last_success_timestamp_seconds", None)] == ok.ended.timestamp()
    assert samples[("pgpoll_last_failure_timestamp_seconds", None)] == failed.ended.timestamp()
    assert samples[("pgpoll_last_run_exit_code", None)] == 4
    assert {k[1]: v for k, v in samples.items() if k[0] == "pgpoll_runs_total"} == {
        "ok": 1, "failed": 1, "interrupted": 1}
    assert samples[("pgpoll_changes_total", None)] == 7
    assert "_created" not in text and "process_" not in text and "python_" not in text
