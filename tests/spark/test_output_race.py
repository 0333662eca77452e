"""A batch read of an output while three ingests race on it with kills: never a duplicate, never a losing run's row.

The racing setup of ``tests/ingest/test_fencing.py`` (three ``jobs/ingest.py``
processes on one slot and one output with different batch sizes, the lease
off so only the commit log's fence keeps them apart, one of them SIGKILLed),
with ``spark.read.format("pgpoll").load(PATH)`` reading the output over and
over meanwhile. Every read must hold each change at most once, only from
partitions the commit log names, and be a prefix of the source's history in
commit order (whole batches: nothing is missing below the newest change it
shows); the read after a final clean run holds every change exactly once.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pgpoll.spark
from pgpoll.sink.commit.log import summarize
from tests.ingest.conftest import ingest, make_capture
from tests.ingest.test_fencing import (
    ALLOWED_EXITS,
    assert_exactly_once,
    plan_files,
    reaped,
    recorded_partitions,
    start_job,
    wait_for_work,
    wait_slot_idle,
    write_round,
)

ROUNDS, ROWS, UPDATED = 2, 8000, 727  # UPDATED: ids of 1..ROWS divisible by 11, once per round


def test_reads_while_ingests_race_with_kills_see_each_committed_change_once(db: Any, spark: Any, tmp_path: Path) -> None:
    pgpoll.spark.register(spark)
    capture = make_capture(db, "pgoutput", tmp_path / "out")
    reads: list[tuple[float, list[tuple[int, int, str]]]] = []  # (started, rows)
    failures: list[BaseException] = []
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            try:
                if (Path(capture.output) / "_pgpoll").exists():
                    started = time.monotonic()
                    frame = spark.read.format("pgpoll").load(capture.output).select("commit_lsn", "seq", "lsn_range")
                    reads.append((started, [(r.commit_lsn, r.seq, r.lsn_range) for r in frame.collect()]))
            except BaseException as exc:  # reported below
                failures.append(exc)
            time.sleep(0.05)

    rng = random.Random("output-race")
    reader = threading.Thread(target=read_loop, daemon=True)
    reader.start()
    codes: list[int] = []
    racing_time: list[tuple[float, float]] = []
    try:
        for round_no in range(ROUNDS):
            write_round(db, round_no * ROWS + 1, ROWS, per_tx=30)
            db.execute("UPDATE items SET v = v || '+' WHERE id %% 11 = 0 AND id <= %s", (ROWS,))
            wait_slot_idle(db, capture.slot)
            head, plans = summarize(capture.output).head, plan_files(capture.output)
            jobs = [start_job(db.dsn, capture.args("--batch-changes", str(n)), tmp_path / f"r{round_no}-{n}.log")
                    for n in (100, 250, 400)]
            with reaped(jobs):
                began = time.monotonic()
                wait_for_work(capture.output, head, plans)
                time.sleep(rng.uniform(0.5, 3.0))
                # a loaded machine reads slowly: let two reads that began during the race finish first (while the
                # runs still race), so every round has reads to check whatever the load
                deadline = time.monotonic() + 120
                while (sum(1 for started, _rows in list(reads) if started >= began) < 2
                       and any(job.proc.poll() is None for job in jobs) and time.monotonic() < deadline):
                    time.sleep(0.05)
                jobs[rng.randrange(len(jobs))].kill()
                codes += [job.wait() for job in jobs]
                racing_time.append((began, time.monotonic()))
        time.sleep(1.0)
    finally:
        stop.set()
        reader.join(timeout=120)
    assert set(codes) <= ALLOWED_EXITS, codes
    assert not failures, failures[:3]
    racing = [rows for started, rows in reads if rows and any(a <= started <= b for a, b in racing_time)]
    assert len(racing) >= 3, f"only {len(racing)} read(s) started while the runs raced"

    wait_slot_idle(db, capture.slot)
    final = ingest(db.dsn, *capture.args())
    assert final.exit_code == 0, final.stderr
    assert_exactly_once(spark, capture, inserted=ROUNDS * ROWS, updated=ROUNDS * UPDATED)
    last = spark.read.format("pgpoll").load(capture.output).select("commit_lsn", "seq").collect()
    assert len(last) == len({(r.commit_lsn, r.seq) for r in last}) == ROUNDS * (ROWS + UPDATED)

    recorded = {p.split("=", 1)[1] for p in recorded_partitions(capture.output)}
    history = sorted({r.commit_lsn for r in last})  # every committed transaction, in commit order
    for rows in racing:
        keys = [(c, s) for c, s, _p in rows]
        assert len(set(keys)) == len(keys), f"{len(keys) - len(set(keys))} change(s) twice in one read"
        assert {p for _c, _s, p in rows} <= recorded, "a read showed a partition no commit-log record names"
        seen = sorted({c for c, _s in keys})
        assert seen == history[: len(seen)], "a read is not a prefix of the history (a batch missing below a later one)"
