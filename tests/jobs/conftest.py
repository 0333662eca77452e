"""Markers of the job tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spark_cluster: starts a Spark standalone master and worker on 127.0.0.1 (about a minute)"
    )
    config.addinivalue_line(
        "markers", "airflow: runs a real Airflow from its own virtualenv (opt-in: PGPOLL_TEST_AIRFLOW=1)"
    )
