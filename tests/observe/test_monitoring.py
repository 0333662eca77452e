"""The alerting rules and the Grafana dashboard in ``monitoring/``: valid, and built only of metrics pgpoll emits."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pgpoll.observe.metrics import ALERTS, BY_NAME, OUTCOMES, POSITIONS
from pgpoll.testing.prometheus import Monitoring
from tests.observe.conftest import DASHBOARD, RULES

NAME = re.compile(r"\bpgpoll_[a-z0-9_]+\b")
MATCHER = re.compile(r'\b(alert|position|outcome|job)\s*=~?\s*"([^"]*)"')
KNOWN_VALUES = {"alert": set(ALERTS), "position": set(POSITIONS), "outcome": set(OUTCOMES),
                "job": {"pgpoll_ingest", "pgpoll_snapshot", "pgpoll_materialize"}}


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_exprs() -> dict[str, str]:
    board = json.loads(DASHBOARD.read_text())
    found = {f"panel {p['title']} {t['refId']}": t["expr"] for p in board["panels"] for t in p["targets"]}
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            found[f"variable {var['name']}"] = var["definition"]
    return found


def unknown_names(exprs: dict[str, str]) -> list[str]:
    """Each ``where: name`` of a pgpoll_ metric the code's registry does not emit, and expressions using none."""
    problems = []
    for where, expr in exprs.items():
        names = NAME.findall(re.sub(r'"[^"]*"', '""', expr))  # a job label's value is no metric
        if not names:
            problems.append(f"{where}: uses no pgpoll metric")
        problems += [f"{where}: {name}" for name in names if name not in BY_NAME]
        problems += [f"{where}: {label}={value!r}" for label, value in MATCHER.findall(expr)
                     if value not in KNOWN_VALUES[label] and not value.startswith("$")]
    return problems


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in result.stdout


def test_every_rule_and_panel_uses_only_metrics_pgpoll_emits() -> None:
    assert unknown_names(rule_exprs()) == []
    assert unknown_names(dashboard_exprs()) == []


def test_the_check_catches_a_misspelt_metric_and_label_value() -> None:
    assert unknown_names({"r": 'pgpoll_slot_lag_byte > 1'}) == ["r: pgpoll_slot_lag_byte"]
    assert unknown_names({"r": 'pgpoll_slot_alert{alert="gone"} == 1'}) == ["r: alert='gone'"]
    assert unknown_names({"r": "up == 0"}) == ["r: uses no pgpoll metric"]


def test_the_rules_the_issue_asks_for_are_there() -> None:
    exprs = rule_exprs()
    assert {"PgpollSlotLost", "PgpollSlotUnreserved", "PgpollSlotAheadOfOutput", "PgpollLagBytesHigh",
            "PgpollNoRecentSuccess", "PgpollRunFailing"} <= set(exprs)


def test_prometheus_loads_and_evaluates_every_rule(monitoring: Monitoring) -> None:
    def health() -> list[tuple[str, Any]]:
        rules = [r for g in monitoring.rules() for r in g["rules"]]
        return [(r["name"], r.get("health")) for r in rules]

    deadline = time.monotonic() + 10
    while any(h != "ok" for _n, h in health()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert sorted(health()) == sorted((name, "ok") for name in rule_exprs())


def test_the_dashboard_is_grafana_json(tmp_path: Path) -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] == "pgpoll"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"])
