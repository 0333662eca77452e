"""The observe tests' Prometheus loads the repository's alerting rules, so they are evaluated for real."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "pgpoll-rules.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "pgpoll-dashboard.json"


@pytest.fixture(scope="session")
def prometheus_rule_files() -> tuple[Path, ...]:
    return (RULES,)
