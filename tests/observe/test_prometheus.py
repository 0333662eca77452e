"""End to end: runs push to a real Pushgateway, a real Prometheus scrapes it, PromQL sees what the runs did.

An ingest, a failed ingest (its publication dropped: exit 4) and a materialize, each with ``--pushgateway``;
then Prometheus's HTTP API answers with the exit codes, the counts, the runs by outcome, and the last
success's timestamp, which the failed run (a ``POST``) left in place. The repository's alerting rules are
loaded too: the failed run fires ``PgpollRunFailing``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg2.extensions
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from pgpoll.cli.main import cli
from pgpoll.observe.metrics import ALERTS, BY_NAME
from pgpoll.observe.run_history import History, RunRecord, fold, load_history
from pgpoll.observe.runs import push_run
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.cluster import free_port
from pgpoll.testing.prometheus import Monitoring, _get, values
from tests.ingest.conftest import ingest, make_capture


def _one(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return values(result)[0]


def test_runs_seen_by_prometheus_and_the_last_success_survives_a_failure(
    db: Any, tmp_path: Path, monitoring: Monitoring,
) -> None:
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    push = ["--pushgateway", monitoring.pushgateway_url]
    where = f'output="{capture.output}"'
    ingest_sel = f'{{job="pgpoll_ingest", {where}, slot="{capture.slot}"}}'

    first = ingest(db.dsn, *capture.args("--typed-tables", *push))
    assert first.exit_code == 0, first.stderr
    success_at = _one(monitoring.wait_for(f"pgpoll_last_success_timestamp_seconds{ingest_sel}", bool))
    assert _one(monitoring.query(f"pgpoll_last_run_changes{ingest_sel}")) == 3
    assert _one(monitoring.query(f"pgpoll_last_run_exit_code{ingest_sel}")) == 0
    assert _one(monitoring.query(f"pgpoll_last_run_lag_bytes{ingest_sel}")) >= 0

    db.execute("DROP PUBLICATION pub_items")
    failed = ingest(db.dsn, *capture.args(*push))
    assert failed.exit_code == 4, failed.stderr
    monitoring.wait_for(f"pgpoll_last_run_exit_code{ingest_sel}", lambda r: values(r) == [4.0])
    assert _one(monitoring.query(f"pgpoll_last_success_timestamp_seconds{ingest_sel}")) == success_at
    assert _one(monitoring.query(f"pgpoll_last_failure_timestamp_seconds{ingest_sel}")) > success_at
    assert _one(monitoring.query(f"pgpoll_last_run_success{ingest_sel}")) == 0
    runs = monitoring.query(f"pgpoll_runs_total{ingest_sel}")
    assert {r["metric"]["outcome"]: float(r["value"][1]) for r in runs} == {"ok": 1, "failed": 1, "interrupted": 0}
    assert _one(monitoring.query(f"pgpoll_changes_total{ingest_sel}")) == 3
    monitoring.wait_for(f'ALERTS{{alertname="PgpollRunFailing", alertstate="firing", {where}}}', bool)

    done = CliRunner().invoke(cli, ["materialize", "--output", capture.output, *push])
    assert done.exit_code == 0, done.output
    mat_sel = f'{{job="pgpoll_materialize", {where}}}'
    assert _one(monitoring.wait_for(f"pgpoll_last_run_changes{mat_sel}", bool)) == 3
    assert _one(monitoring.query(f"pgpoll_last_run_exit_code{mat_sel}")) == 0
    assert _one(monitoring.query(f"pgpoll_last_run_exit_code{ingest_sel}")) == 4  # groups apart

    history = load_history(open_output(capture.output))
    assert [(r.job, r.exit_code, r.error) for r in history.records] == [
        ("ingest", 0, None), ("ingest", 4, "PublicationNotFoundError"), ("materialize", 0, None)]
    pushed = _get(f"{monitoring.pushgateway_url}/metrics").decode()
    password = psycopg2.extensions.parse_dsn(db.dsn).get("password")
    assert password and password not in pushed and db.dsn not in pushed


def test_a_push_that_fails_is_a_warning_and_the_run_still_succeeds(db: Any, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    nobody = f"http://user:s3cret@127.0.0.1:{free_port()}"
    result = ingest(db.dsn, *capture.args("--pushgateway", nobody))
    assert result.exit_code == 0, result.stderr
    assert result.summary is not None and result.summary["changes"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "pgpoll.observe"]
    assert any("could not push" in w for w in warnings), warnings
    assert not any("s3cret" in w for w in warnings)
    assert load_history(open_output(capture.output)).records[0].changes == 1  # recorded all the same


def test_status_prometheus_text_parses_and_matches_the_json(db: Any, tmp_path: Path) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(db.dsn, *capture.args()).exit_code == 0
    runner = CliRunner()
    env = {"PGPOLL_DSN": db.dsn}
    text = runner.invoke(cli, ["status", "--output", capture.output, "--format", "prometheus"], env=env)
    assert text.exit_code == 0, text.output
    families = {f.name: f for f in text_string_to_metric_families(text.stdout)}
    assert set(families) <= {name for name, spec in BY_NAME.items() if spec.source == "status"}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    slot = capture.slot
    assert samples[("pgpoll_output_position", (("output", capture.output), ("position", "in_sync"),
                                               ("slot", slot)))] == 1
    assert samples[("pgpoll_output_position_bytes", (("output", capture.output), ("slot", slot)))] == 0
    alerts = {dict(k[1])["alert"]: v for k, v in samples.items() if k[0] == "pgpoll_slot_alert"}
    assert alerts == dict.fromkeys(ALERTS, 0)  # every alert pgpoll names, 0 on a healthy slot
    assert samples[("pgpoll_slot_lag_seconds", (("slot", slot),))] == 0  # caught up, nothing written since
    assert samples[("pgpoll_slot_lag_bytes", (("slot", slot),))] >= 0
    both = runner.invoke(cli, ["status", "--json", "--format", "prometheus"], env=env)
    assert both.exit_code == 2


def _group(text: str, output: str) -> dict[str, float]:
    """The samples of one output's group on the Pushgateway's /metrics, by name."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("output") == output and sample.name.startswith("pgpoll_"):
                outcome = sample.labels.get("outcome")
                found[f"{sample.name}:{outcome}" if outcome else sample.name] = sample.value
    return found


def test_a_failure_adds_to_the_group_and_a_success_replaces_it(monitoring: Monitoring, tmp_path: Path) -> None:
    """Without a history to repeat it (unreadable output), only the POST keeps the last success's timestamp."""
    output = str(tmp_path / "pushed")
    ok = RunRecord(run_id="a", job="ingest", started_at="2026-01-01T00:00:00+00:00",
                   ended_at="2026-01-01T00:00:10+00:00", seconds=10.0, status="ok", exit_code=0, slot="s1",
                   changes=5, lag_bytes=100)
    assert push_run(monitoring.pushgateway_url, ok, fold(History(), [ok]), output=output)
    failed = replace(ok, run_id="b", ended_at="2026-01-01T00:05:00+00:00", status="error", exit_code=5,
                     changes=0, lag_bytes=None)
    assert push_run(monitoring.pushgateway_url, failed, None, output=output)
    group = _group(_get(f"{monitoring.pushgateway_url}/metrics").decode(), output)
    assert group["pgpoll_last_success_timestamp_seconds"] == ok.ended.timestamp()
    assert group["pgpoll_last_failure_timestamp_seconds"] == failed.ended.timestamp()
    assert group["pgpoll_last_run_exit_code"] == 5
    assert group["pgpoll_last_run_lag_bytes"] == 100  # POST: what the failure did not push stays
    later = replace(ok, run_id="c", ended_at="2026-01-01T00:10:00+00:00", lag_bytes=None)
    assert push_run(monitoring.pushgateway_url, later, fold(History(), [ok, failed, later]), output=output)
    group = _group(_get(f"{monitoring.pushgateway_url}/metrics").decode(), output)
    assert "pgpoll_last_run_lag_bytes" not in group  # PUT: the group is replaced
    assert group["pgpoll_last_success_timestamp_seconds"] == later.ended.timestamp()
    assert group["pgpoll_last_failure_timestamp_seconds"] == failed.ended.timestamp()  # from the history
    assert (group["pgpoll_runs_total:ok"], group["pgpoll_runs_total:failed"]) == (2, 1)
