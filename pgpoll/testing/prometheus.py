"""A real Pushgateway and a real Prometheus on loopback, to prove what pgpoll's runs push is what Prometheus sees.

Debian's ``prometheus-pushgateway`` and ``prometheus`` (``.ci/run`` installs them and stops their system
services), each started on a free loopback port with its data in a temporary directory. Prometheus scrapes the
Pushgateway every second with ``honor_labels: true`` (the pushed ``job`` label stays, as the Pushgateway's
documentation asks) and evaluates the given rule files every second, so a test reads a push back through
PromQL (:meth:`Monitoring.wait_for`) within about two seconds. The binaries are found on ``PATH`` (or at
``PGPOLL_TEST_PROMETHEUS`` and ``PGPOLL_TEST_PUSHGATEWAY``); :func:`missing` says which is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgpoll.testing.cluster import free_port


def binary(name: str, env: str) -> str | None:
    """``name`` on PATH, or the path in the variable ``env``; None when absent."""
    given = os.environ.get(env)
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which(name)


def missing() -> list[str]:
    """The binaries of :class:`Monitoring` that are not installed."""
    wanted = (("prometheus", "PGPOLL_TEST_PROMETHEUS"), ("prometheus-pushgateway", "PGPOLL_TEST_PUSHGATEWAY"))
    return [name for name, env in wanted if binary(name, env) is None]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited {process.returncode}: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError):
            _get(url + "/-/ready", timeout=1.0)
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s: {log.read_text(errors='replace')[-2000:]}")


@dataclass
class Monitoring:
    """A Pushgateway and a Prometheus scraping it; ``rule_files`` are loaded by Prometheus."""

    rule_files: Sequence[Path] = ()
    pushgateway_url: str = ""
    prometheus_url: str = ""
    root: Path | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> Monitoring:
        self.root = Path(tempfile.mkdtemp(prefix="pgpoll-prometheus-"))
        gateway_port, prometheus_port = free_port(), free_port()
        self.pushgateway_url = f"http://127.0.0.1:{gateway_port}"
        self.prometheus_url = f"http://127.0.0.1:{prometheus_port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": "pushgateway", "honor_labels": True,
                                "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]}],
        }
        (self.root / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        gateway = binary("prometheus-pushgateway", "PGPOLL_TEST_PUSHGATEWAY")
        prometheus = binary("prometheus", "PGPOLL_TEST_PROMETHEUS")
        if gateway is None or prometheus is None:
            raise RuntimeError(f"not installed: {', '.join(missing())}")
        try:  # a server that does not start stops the other: the caller gets no object to stop
            self._spawn("pushgateway", [gateway, f"--web.listen-address=127.0.0.1:{gateway_port}"])
            self._spawn("prometheus", [
                prometheus, f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'data'}", f"--web.listen-address=127.0.0.1:{prometheus_port}",
                "--log.level=warn",
            ])
            _wait_ready(self.pushgateway_url, self.processes[0], self.root / "pushgateway.log")
            _wait_ready(self.prometheus_url, self.processes[1], self.root / "prometheus.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.root is not None
        with (self.root / f"{name}.log").open("wb") as log:
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.root))

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (Prometheus's HTTP API)."""
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        body = json.loads(_get(url))
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        return list(body["data"]["result"])

    def wait_for(self, promql: str, check: Callable[[list[dict[str, Any]]], bool],
                 timeout: float = 15.0) -> list[dict[str, Any]]:
        """Query until ``check`` accepts the result (a scrape and a rule evaluation take about a second each)."""
        deadline = time.monotonic() + timeout
        result = self.query(promql)
        while not check(result):
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql}: still {result} after {timeout}s")
            time.sleep(0.25)
            result = self.query(promql)
        return result

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups (the HTTP API's ``rules`` endpoint)."""
        return list(json.loads(_get(f"{self.prometheus_url}/api/v1/rules"))["data"]["groups"])

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def values(result: list[dict[str, Any]]) -> list[float]:
    """The sample values of an instant vector."""
    return [float(r["value"][1]) for r in result]
