"""Test configuration: the throwaway-PostgreSQL and Spark fixtures live in pgpoll.testing."""

from __future__ import annotations

pytest_plugins = ["pgpoll.testing.pytest_plugin"]
