"""Issue 24's proof on real object stores: exactly once through racing runs, kills and an application writing.

On SeaweedFS (a real S3 store), both plugins: rows that existed before the
slot, an application writing all the while (small and large transactions,
updates and deletes), rounds of three ``jobs/ingest.py`` processes racing on
one slot and one ``s3://`` output with the lease off (``PGPOLL_TEST_NO_LOCK``,
so only the commit log's conditional create keeps them apart) and one of them
SIGKILLed at a random moment, a snapshot into the same output, then clean
runs and ``materialize --format delta --to s3://...``. A reader polling the
change log as a Delta table during the races never sees a duplicate or a row
that vanished. In the end the change log holds every change exactly once, the
slot sits at the commit log's high-water mark, and the state equals ``SELECT *``
from the source value for value, read back with pyarrow, DuckDB and polars.
The same rounds run against moto's S3 server and Azurite (one plugin).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.materialize.delta.names import logical_table
from pgpoll.sink import layout
from pgpoll.sink.commit.log import summarize
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.testing.object_stores import StoreBucket
from pgpoll.testing.pytest_plugin import store_server
from tests.ingest.conftest import Capture, confirmed_lsn
from tests.ingest.test_fencing import ALLOWED_EXITS, reaped, start_job, wait_slot_idle

BATCH_CHANGES = (400, 900, 1500)
TABLE = "CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10,2), ts timestamptz, j jsonb)"


@dataclass
class App:
    """The application: writes in small and large transactions until stopped; counts what it did."""

    db: Any
    next_id: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> App:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        rng = random.Random(7)
        conn = self.db.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                while not self._stop.wait(rng.uniform(0.005, 0.03)):
                    size = 1500 if rng.random() < 0.02 else rng.randint(1, 25)
                    cur.execute("INSERT INTO items SELECT g, 'v' || g, g / 7.0, now(), jsonb_build_object('g', g) "
                                "FROM generate_series(%s, %s) g", (self.next_id, self.next_id + size - 1))
                    self.next_id += size
                    self.inserted += size
                    if rng.random() < 0.3:
                        cur.execute("UPDATE items SET v = v || '+' WHERE id %% 53 = %s", (rng.randrange(53),))
                        self.updated += cur.rowcount
                    if rng.random() < 0.15:
                        cur.execute("DELETE FROM items WHERE id %% 211 = %s", (rng.randrange(211),))
                        self.deleted += cur.rowcount
        except Exception as exc:  # reported by the test
            self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        assert not self.errors, self.errors


@dataclass
class DeltaPoller:
    """Reads the change log as a Delta table over and over: no duplicate in a read, nothing vanishes between reads."""

    output: str
    reads: int = 0
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> DeltaPoller:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        fs = open_output(self.output)
        seen: set[tuple[int, int]] = set()
        while not self._stop.wait(0.3):
            try:
                if not fs.exists(fs.path(layout.CHANGES, "_delta_log")):
                    continue
                table = read_delta(fs.path(layout.CHANGES))
            except Exception as exc:  # the table being created: read again
                self.errors.append(repr(exc))
                continue
            keys = list(zip(table.column("commit_lsn").to_pylist(), table.column("seq").to_pylist(), strict=True))
            now = set(keys)
            if len(now) != len(keys):
                self.problems.append(f"read {self.reads}: {len(keys) - len(now)} duplicate change(s)")
            if not seen <= now:
                self.problems.append(f"read {self.reads}: {len(seen - now)} change(s) vanished")
            seen, self.reads = now, self.reads + 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def check(self) -> None:
        assert self.reads > 0, f"the change log was never read: {self.errors[-3:]}"
        assert not self.problems, self.problems


def _cli(dsn: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"PGPOLL_DSN": dsn})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _race_round(db: Any, capture: Any, tmp_path: Path, rng: random.Random, round_no: int) -> None:
    wait_slot_idle(db, capture.slot)
    jobs = [start_job(db.dsn, capture.args("--batch-changes", str(n), "--max-seconds", "6"),
                      tmp_path / f"r{round_no}-{n}.log") for n in BATCH_CHANGES]
    with reaped(jobs):
        time.sleep(rng.uniform(0.5, 3.0))
        jobs[rng.randrange(len(jobs))].kill()
        codes = [job.wait() for job in jobs]
    assert set(codes) <= ALLOWED_EXITS, [(c, j.stderr()) for c, j in zip(codes, jobs, strict=True) if c not in ALLOWED_EXITS]


def _source(db: Any) -> list[dict[str, Any]]:
    rows = db.execute("SELECT id, v, n, ts, j::text FROM items ORDER BY id")
    return [{"id": i, "v": v, "n": n, "ts": ts, "j": json.loads(j)} for i, v, n, ts, j in rows]


def _lake(table: pa.Table) -> list[dict[str, Any]]:
    rows = logical_table(table).select(["id", "v", "n", "ts", "j"]).sort_by("id").to_pylist()
    return [{**r, "j": json.loads(r["j"]), "n": Decimal(r["n"]) if r["n"] is not None else None} for r in rows]


def _race_and_check(db: Any, store: StoreBucket, plugin: str, tmp_path: Path, rounds: int, readers: bool) -> None:
    db.execute(TABLE)
    db.execute("INSERT INTO items SELECT g, 'old' || g, g / 3.0, now(), '{}' FROM generate_series(1, 2000) g")
    capture = make_capture_existing(db, plugin, store.child("out"))
    capture_args = capture.args("--typed-tables")
    capture.args = lambda *extra: [*capture_args, *extra]  # type: ignore[method-assign]
    rng = random.Random(f"store-fencing-{store.kind}-{plugin}")
    app = App(db, next_id=2001).start()
    try:
        with DeltaPoller(capture.output) as poller:
            for round_no in range(rounds):
                _race_round(db, capture, tmp_path, rng, round_no)
                if round_no == 0:  # the rows from before the slot, into the same output, while the app writes
                    code, text = _cli(db.dsn, "snapshot", "--slot", capture.slot, "--output", capture.output,
                                      *(["--publication", "pub_items"] if plugin == "pgoutput" else ["--tables", "public.items"]))
                    assert code == 0, text
        poller.check()
    finally:
        app.stop()
    wait_slot_idle(db, capture.slot)
    code, text = _cli(db.dsn, "ingest", *capture.args())
    assert code == 0, text
    changes = read_delta(open_output(capture.output).path(layout.CHANGES))
    keys = list(zip(changes.column("commit_lsn").to_pylist(), changes.column("seq").to_pylist(), strict=True))
    assert len(set(keys)) == len(keys), f"{len(keys) - len(set(keys))} change(s) twice in the change log"
    ops = changes.column("op").to_pylist()
    inserted = sorted(int(dict(a)["id"]) for a, op in zip(changes.column("after").to_pylist(), ops, strict=True) if op == "I")
    assert inserted == list(range(2001, app.next_id)), "inserts missing or twice"
    assert (ops.count("U"), ops.count("D")) == (app.updated, app.deleted)
    summary = summarize(capture.output)
    assert summary.rows == len(keys) and confirmed_lsn(db, capture.slot) == str(summary.high_water_mark)
    dest = store.child("state")
    code, text = _cli(db.dsn, "materialize", "--output", capture.output, "--to", dest, "--format", "delta")
    assert code == 0, text
    expected = _source(db)
    state_path = open_output(dest).path(layout.table_dir_name("public", "items"))
    assert _lake(read_delta(state_path)) == expected
    if readers:
        assert _duckdb_rows(state_path, store) == [(r["id"], r["v"]) for r in expected]
        assert _polars_rows(state_path, store) == [(r["id"], r["v"]) for r in expected]
        assert _duckdb_count(open_output(capture.output).path(layout.CHANGES), store) == len(keys)


def make_capture_existing(db: Any, plugin: str, output: str) -> Capture:
    """The slot (and publication) for the ``items`` table made above."""
    db.require_plugin(plugin)
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    if plugin == "pgoutput":
        db.execute("CREATE PUBLICATION pub_items FOR TABLE items")
    return Capture(db, plugin, slot, output)


def _duckdb(store: StoreBucket) -> Any:
    import duckdb
    import duckdb_extension_delta
    import duckdb_extension_httpfs

    def ext(module: Any, name: str) -> Path:
        return Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{ext(duckdb_extension_httpfs, 'httpfs')}'")
    con.execute(f"LOAD '{ext(duckdb_extension_delta, 'delta')}'")
    env = store.env
    endpoint = env["AWS_ENDPOINT_URL"].split("://", 1)[1]
    con.execute(f"CREATE SECRET lake (TYPE s3, KEY_ID '{env['AWS_ACCESS_KEY_ID']}', SECRET '{env['AWS_SECRET_ACCESS_KEY']}', "
                f"REGION '{env['AWS_REGION']}', ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false)")
    return con


def _duckdb_rows(path: str, store: StoreBucket) -> list[tuple[Any, ...]]:
    with contextlib.closing(_duckdb(store)) as con:
        return [tuple(r) for r in con.execute(f"SELECT id, v FROM delta_scan('{path}') ORDER BY id").fetchall()]


def _duckdb_count(path: str, store: StoreBucket) -> int:
    with contextlib.closing(_duckdb(store)) as con:
        return int(con.execute(f"SELECT count(*) FROM delta_scan('{path}')").fetchone()[0])


def _polars_rows(path: str, store: StoreBucket) -> list[tuple[Any, ...]]:
    import polars as pl

    options = open_output(path).location.storage_options()  # type: ignore[attr-defined]
    frame = pl.scan_delta(path, storage_options=options).select("id", "v").sort("id").collect()
    return [tuple(r) for r in frame.iter_rows()]


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_racing_runs_on_s3_with_kills_an_app_and_a_snapshot_commit_every_change_once(
    db: Any, s3_bucket: StoreBucket, tmp_path: Path, plugin: str
) -> None:
    _race_and_check(db, s3_bucket, plugin, tmp_path, rounds=2, readers=True)


@pytest.mark.parametrize("kind", ["moto", "azurite"])
def test_the_same_rounds_on_moto_and_azurite(db: Any, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = store_server(kind).bucket()
    for name in list(os.environ):
        if name.startswith(("AWS_", "AZURE_", "AZURITE_")):
            monkeypatch.delenv(name)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    _race_and_check(db, bucket, "pgoutput", tmp_path, rounds=1, readers=False)
