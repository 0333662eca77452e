"""ruff and mypy as tests: ``make test`` fails on their findings and prints them.

Both run from this interpreter's environment (``sys.executable -m ...``), at the exact versions pinned in
the ``test`` extra, with their configuration from ``pyproject.toml``: ruff over the whole tree (package,
tests, jobs, benchmarks), mypy strict over ``pgpoll/``. A missing tool is a failure, not a skip: a suite
that silently stopped checking would look the same as a clean one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    probe = subprocess.run([sys.executable, "-m", tool, "--version"], capture_output=True, text=True, check=False)
    assert probe.returncode == 0, (
        f"{tool} is not installed in {sys.executable}'s environment; install the test extra "
        f"(pip install -e '.[test]', which `make install` does): {probe.stderr.strip()}"
    )
    return subprocess.run(
        [sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=900
    )


def test_ruff_finds_nothing() -> None:
    result = _run("ruff", "check", "--no-fix", "--output-format", "concise", ".")
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"


def test_mypy_strict_finds_nothing() -> None:
    # Files and strictness come from [tool.mypy] in pyproject.toml.
    result = _run("mypy")
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"
