"""A real Spark standalone cluster on 127.0.0.1 for tests: one master and one worker, from the pyspark package.

:class:`StandaloneCluster` starts ``spark-class org.apache.spark.deploy.master.Master``
and ``...worker.Worker`` on free loopback ports, each in its own process group,
and :meth:`StandaloneCluster.stop` ends exactly those two groups (the worker's
executors die with the worker). :func:`deps_only_python` makes a Python that
has pgpoll's third-party dependencies but not pgpoll — what a cluster node
with the dependencies installed looks like — so a job can only import pgpoll
from what spark-submit ships.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def spark_env(conf_dir: Path, **extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH and PYSPARK_*, bound to loopback, with an empty Spark conf dir."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("PYSPARK_", "SPARK_"))}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP=LOOPBACK,  # RPC and the web UIs bind here, not on 0.0.0.0
        SPARK_DAEMON_MEMORY="512m",
    )
    env.update(extra)
    return env


def deps_only_python(where: Path) -> Path:
    """A venv whose only packages are this venv's site-packages, reached without its ``.pth`` files.

    The editable install of pgpoll works through a ``.pth`` file, which only a
    site directory runs; a path listed in a ``.pth`` file is added as a plain
    ``sys.path`` entry. So this Python imports psycopg2, pyarrow, tenacity,
    pyspark... but not pgpoll.
    """
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)  # type: ignore[attr-defined]
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    Path(site, "pgpoll_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@dataclass
class StandaloneCluster:
    """One master and one worker (1 core, 1 GB) on 127.0.0.1."""

    base: Path
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    worker_port: int = field(default_factory=free_port)
    worker_ui_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The master URL for ``spark-submit --master``."""
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def work_dir(self) -> Path:
        """The worker's directory (one ``app-*/<executor>/`` per application)."""
        return self.base / "worker"

    @property
    def conf_dir(self) -> Path:
        return self.base / "conf"

    def _start(self, name: str, *args: str) -> None:
        log = open(self.base / f"{name}.log", "wb")  # noqa: SIM115 (closed when the process ends)
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=spark_env(self.conf_dir), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self.procs.append(proc)

    def start(self, timeout: float = 120) -> StandaloneCluster:
        """Start the master, then the worker; return when the master lists the worker as alive."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", LOOPBACK, "--port", str(self.master_port), "--webui-port", str(self.master_ui_port),
        )
        self._start(
            "worker", "org.apache.spark.deploy.worker.Worker",
            "--host", LOOPBACK, "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
            "--cores", "1", "--memory", "1g", "--work-dir", str(self.work_dir), self.url,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc, name in zip(self.procs, ("master", "worker"), strict=False):
                if proc.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}")
            state = self.state()
            if state and state.get("aliveworkers", 0) >= 1:
                return self
            time.sleep(1)
        raise RuntimeError(f"no worker registered with {self.url} within {timeout}s:\n{self.log('worker')[-3000:]}")

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, running and completed applications), or None when not up."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.master_ui_port}/json/", timeout=5) as resp:
                return dict(json.load(resp))
        except OSError:
            return None

    def log(self, name: str) -> str:
        """The master's or the worker's log so far."""
        path = self.base / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """End the worker (and its executors), then the master: SIGTERM, then SIGKILL after 20 s."""
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)  # also when the JVM is gone: an executor may be left in its group
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=20)
        self.procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group this test started (its id is the leader's pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
