"""The documentation site, built once per test session with ``mkdocs build --strict`` (as ``make docs`` does)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Build:
    """One ``mkdocs build``: where the site went and what mkdocs said."""

    site: Path
    returncode: int
    output: str


def mkdocs_build(config: Path, site: Path) -> Build:
    """``mkdocs build --strict`` of ``config`` into ``site``, with this interpreter's mkdocs."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0, not a warning of ours
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return Build(site, done.returncode, done.stdout + done.stderr)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    yield mkdocs_build(ROOT / "mkdocs.yml", tmp_path_factory.mktemp("site") / "site")


def load_generator() -> ModuleType:
    """``docs/gen_reference.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
