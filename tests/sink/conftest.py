"""Helpers for the sink's unit tests: a local output and staged batches written by hand (no JVM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit.batches import BatchSink, Plan
from pgpoll.sink.commit.log import CommitRecord


def stage(plan: Plan, files: int = 2, tables: dict[str, int] | None = None) -> dict[str, list[tuple[str, int]]]:
    """Write what Spark would: ``files`` part files under the plan's staging (and typed tables); returns the tables."""
    root = Path(plan.staging)
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"part-{i:05d}-{plan.id}.parquet").write_bytes(b"PAR1" + bytes(10 + i))
    (root / "_SUCCESS").write_bytes(b"")
    typed: dict[str, list[tuple[str, int]]] = {}
    for name, count in (tables or {}).items():
        directory = Path(plan.tables_staging) / name
        directory.mkdir(parents=True)
        typed[name] = []
        for i in range(count):
            path = directory / f"part-{i:05d}-{plan.id}.parquet"
            path.write_bytes(b"PAR1" + bytes(20 + i))
            typed[name].append((path.name, path.stat().st_size))
    return typed


def publish_next(sink: BatchSink, plan: Plan, *, span: int = 0x10, rows: int = 3, **kwargs: Any) -> CommitRecord:
    """Publish a staged batch whose range starts just above the plan's high-water mark."""
    base = int(plan.high_water_mark) if plan.high_water_mark is not None else 0
    return sink.publish(plan, start=base + 1, end=base + span, rows=rows, slot="s", plugin="pgoutput", **kwargs)


def write_v1(out: Path, start: int, end: int, rows: int = 1, files: int = 1) -> str:
    """A version-1 commit record and its partition, as pgpoll 0.x wrote them; returns the partition name."""
    partition = layout.partition_name(start, end)
    directory = out / layout.CHANGES / partition
    directory.mkdir(parents=True)
    names = []
    for i in range(files):
        (directory / f"part-{i:05d}.parquet").write_bytes(b"PAR1")
        names.append(f"part-{i:05d}.parquet")
    record = {
        "start": str(Lsn(start)), "end": str(Lsn(end)), "rows": rows, "files": names, "partition": partition,
        "slot": "s", "plugin": "test_decoding", "committed_at": "2024-01-01T00:00:00+00:00", "adopted": False,
        "last_commit_ts": "2024-01-01T00:00:00+00:00", "tables": [],
    }
    commits = out / layout.COMMITS
    commits.mkdir(parents=True, exist_ok=True)
    (commits / layout.commit_record_name(end)).write_text(json.dumps(record, sort_keys=True))
    return partition


def staging_names(out: Path) -> set[str]:
    """Every entry of ``_pgpoll/staging``."""
    directory = out / layout.STAGING
    return {p.name for p in directory.iterdir()} if directory.exists() else set()
