"""Benchmark: routine commands at 1,000 and at 10,000 committed batches, side by side (years of history: "flat").

Each output is built fast with the real commit-log classes rather than real
ingests (10,000 ingest runs would take hours): one typed table ``public.t``
(``id int4`` key, ``v text``; its schema and ledger as ``ingest
--typed-tables`` writes them), and per batch one typed Parquet partition
under ``tables/`` (one UPDATE of one of 100 keys, with ``_commit_lsn`` and
``_xid``), a placeholder change file under ``changes/``, and a
``CommitRecord`` written under its real name carrying what
``BatchSink.publish`` fills in (``table_files``, ``xid_min``/``xid_max``,
and the ``prev_rows``/``prev_tables`` chains), a checkpoint every
``CHECKPOINT_EVERY`` records by ``CommitLog.write_checkpoint``. The state
(default Parquet, driver engine) is materialized once over the whole history,
then ``--new`` more batches are published with ``CommitLog.create`` (their
chains taken from the log's state as ``publish`` does, and checkpointed as it
does). Then, medians of ``--repeat`` runs, all in this process on the local
filesystem (no JVM, no server; Python's start-up and imports are in none):

* **ingest start-up**: the writable check, recovery at start, a plan and its
  discard (as ``bench_startup.py`` measures it), and apart the part of it
  that opens the change table's Delta log (``changes/_delta_log``: the first
  start-up writes its version listing every batch, checkpointed after the new
  batches as its checkpoint every 10 versions would be; delta-rs reads the
  checkpoint, which lists every live file of ``changes/``);
* **incremental materialize**: ``pgpoll materialize --output OUT --json``
  with ``PGPOLL_MATERIALIZE_ENGINE=driver`` applying the ``--new`` batches to
  the state built before them (the state directory restored, untimed, before
  each run);
* **status**: the commit-log part of ``pgpoll status --output``
  (``summarize``; the rest of status asks the server about its slots);
* **batches**: ``pgpoll batches --output OUT`` (the newest 20).

With ``--compact``, a copy of each output is compacted (``pgpoll compact``: every batch but the newest merged
into files of 128 MiB, the replaced ones deleted, the change table's Delta log checkpointed after its
compaction version) and measured beside it; the change files are then real one-row Parquet files (compaction
reads them), not placeholders.

Beside each time, the output's metadata reads of one run: ``read_text``,
``read_tagged``, ``exists`` and ``list`` calls on the output's ``OutputFs``
(commit records, checkpoints, pointer, schemas, ledgers, directory listings);
the Parquet data files materialize reads through pyarrow are not counted.

    python bench/bench_history.py [--batches 1000,10000] [--repeat 3] [--new 5] [--compact]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from deltalake import DeltaTable

from pgpoll.cli.main import cli
from pgpoll.housekeeping.compact import Compaction, CompactOptions
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.change_table import ChangeTable
from pgpoll.sink.commit.log import CHECKPOINT_EVERY, CommitLog, CommitRecord, LogState, record_name, summarize
from pgpoll.sink.envelope import ENVELOPE_SCHEMA
from pgpoll.sink.stores.local import LocalOutputFs
from pgpoll.typed.mapping import PgType
from pgpoll.typed.rows import ColumnLedger, TypedLayout
from pgpoll.typed.schemas import ColumnSchema, TableSchema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import start_up  # the same start-up as bench_startup.py

FILE = "part-00000.parquet"
KEYS = 100
TS = datetime(2026, 11, 1, tzinfo=UTC)
T = TableSchema("public", "t", (ColumnSchema("id", PgType("int4", "integer")), ColumnSchema("v", PgType("text", "text"))),
                ("id",), "d")
TABLE = layout.table_dir_name(T.schema, T.table)
DELTA_OPEN = "  of which: opening the change table's Delta log"
COUNTED = ("read_text", "read_tagged", "exists", "list")


class Output:
    """An output of typed batches of ``public.t``, written with the commit-log classes (see the module docstring)."""

    def __init__(self, root: Path, real_changes: bool = False) -> None:
        self.root = root
        self.real_changes = real_changes
        self.log = CommitLog(LocalOutputFs(str(root)))
        ledger = ColumnLedger()
        self.typed = TypedLayout.build([T], ledger)
        self.schema = self.typed.arrow_schema()
        if "_xid" not in self.schema.names:
            self.schema = self.schema.append(pa.field("_xid", pa.int64()))
        for rel, text in ((f"{layout.SCHEMAS}/{T.schema_id}.json", T.to_json()),
                          (f"{layout.LEDGERS}/{TABLE}.json", json.dumps(ledger.to_json()))):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        (root / layout.COMMITS).mkdir(parents=True, exist_ok=True)
        self.seq = 0
        self.checkpoint = None
        self.tail: list[CommitRecord] = []

    def _files(self, seq: int) -> tuple[str, str, str, int]:
        """The batch's typed and change files: its start, end, partition and the typed file's size."""
        start, end = seq * 0x10, seq * 0x10 + 8
        partition = layout.partition_name(start, end)
        row = {"id": seq % KEYS, "v": f"v{seq}", "_op": "I" if seq <= KEYS else "U", "_commit_lsn": end, "_seq": 0,
               "_commit_ts": TS, "_unchanged_toast": None, "_before": None, "_schema_id": T.schema_id,
               "_xid": 1000 + seq}
        typed = self.root / layout.TABLES / TABLE / partition
        typed.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([row], schema=self.schema), typed / FILE)
        changes = self.root / layout.CHANGES / partition
        changes.mkdir(parents=True)
        if self.real_changes:  # compaction reads them
            change = {"commit_lsn": end, "lsn": end - 1, "seq": 0, "xid": 1000 + seq, "commit_ts": TS, "op": "U",
                      "schema_name": "public", "table_name": "t", "after": [("id", str(seq % KEYS))]}
            pq.write_table(pa.Table.from_pylist([change], schema=ENVELOPE_SCHEMA), changes / FILE)
        else:
            (changes / FILE).write_bytes(b"PAR1")  # nothing routine reads the change files
        return str(Lsn(start)), str(Lsn(end)), partition, (typed / FILE).stat().st_size

    def _record(self, seq: int, prev_rows: int, prev_table: int) -> CommitRecord:
        start, end, partition, size = self._files(seq)
        return CommitRecord(
            start=start, end=end, rows=1, files=[FILE], partition=partition, slot="bench", plugin="pgoutput",
            tables=[TABLE], seq=seq, prev=seq - 1 or None, file_sizes={FILE: self._size(partition)},
            bytes=self._size(partition),
            table_files={TABLE: {FILE: size}}, staging=f"staging-{seq}", xid_min=1000 + seq, xid_max=1000 + seq,
            prev_rows=prev_rows, prev_tables={TABLE: prev_table},
        )

    def _size(self, partition: str) -> int:
        return (self.root / layout.CHANGES / partition / FILE).stat().st_size

    def build(self, batches: int) -> None:
        """``batches`` batches written plainly (fast), the chains as publish sets them: every batch the previous."""
        for seq in range(self.seq + 1, batches + 1):
            record = self._record(seq, seq - 1, seq - 1)
            (self.root / layout.COMMITS / record_name(seq)).write_text(record.to_json())
            self.tail.append(record)
            if len(self.tail) >= CHECKPOINT_EVERY:
                state = LogState(head=seq, checkpoint=self.checkpoint, tail=tuple(self.tail))
                self.log.write_checkpoint(state, seq)
                self.checkpoint, self.tail = state.fold(seq), []
        self.seq = batches

    def publish(self, count: int) -> None:
        """``count`` more batches through ``CommitLog.create``, chained and checkpointed as ``BatchSink.publish``."""
        for _ in range(count):
            before = self.log.state()
            index = before.table_index()
            seq = before.head + 1
            record = self._record(seq, before.newest_data(), index[TABLE][0] if TABLE in index else 0)
            assert self.log.create(record), seq
            state = self.log.state()
            if seq - (state.checkpoint.seq if state.checkpoint else 0) >= CHECKPOINT_EVERY:
                self.log.write_checkpoint(state, seq)
            self.seq = seq


def counting() -> tuple[Counter[str], Callable[[], None]]:
    """Count the metadata calls on every ``LocalOutputFs``; returns the counter and an undo."""
    seen: Counter[str] = Counter()
    saved = {name: getattr(LocalOutputFs, name) for name in COUNTED}

    def wrap(name: str) -> Callable[..., object]:
        inner = saved[name]

        def counted(self: LocalOutputFs, *args: object, **kwargs: object) -> object:
            seen[name] += 1
            return inner(self, *args, **kwargs)
        return counted

    for name in COUNTED:
        setattr(LocalOutputFs, name, wrap(name))

    def undo() -> None:
        for name, fn in saved.items():
            setattr(LocalOutputFs, name, fn)
    return seen, undo


def materialize(root: Path) -> dict[str, object]:
    """``pgpoll materialize --output ROOT --json`` in the driver: the table's summary."""
    result = CliRunner().invoke(cli, ["materialize", "--output", str(root), "--json"],
                                env={"PGPOLL_MATERIALIZE_ENGINE": "driver"})
    if result.exit_code != 0:
        raise SystemExit(f"materialize failed ({result.exit_code}): {result.output[-3000:]}")
    tables = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return next(t for t in tables if "table" in t)


def batches(root: Path) -> None:
    result = CliRunner().invoke(cli, ["batches", "--output", str(root)])
    if result.exit_code != 0:
        raise SystemExit(f"batches failed ({result.exit_code}): {result.output[-3000:]}")


def once(fn: Callable[[], object], before: Callable[[], object] | None = None) -> tuple[float, Counter[str]]:
    """One timing of ``fn`` (``before`` untimed before it) and its metadata calls."""
    if before is not None:
        before()
    seen, undo = counting()
    try:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started, seen
    finally:
        undo()


def prepare(work: Path, size: int, new: int,
            compact: bool = False) -> dict[str, tuple[Callable[[], object], Callable[[], object] | None]]:
    """Build an output of ``size`` batches, its state, ``new`` batches after it: the measurements on it (and with
    ``compact`` on a compacted copy of it)."""
    root = work / f"out{size}"
    out = Output(root, real_changes=compact)
    started = time.perf_counter()
    out.build(size)
    start_up(LocalOutputFs(str(root)), str(root))  # the first start's full pass, once (writes the pointer)
    built = time.perf_counter() - started
    started = time.perf_counter()
    first = materialize(root)
    print(f"built {size:,} batches in {built:.1f} s; first materialize ({first.get('mode')}, "
          f"{first.get('batches')} batches) in {time.perf_counter() - started:.1f} s", flush=True)
    out.publish(new)
    start_up(LocalOutputFs(str(root)), str(root))  # adds the new batches to the change table, as publish does
    DeltaTable(str(root / layout.CHANGES)).create_checkpoint()  # as its checkpoint every 10 versions would
    state, saved = root / "state", work / f"state{size}"
    shutil.copytree(state, saved)

    def restore() -> None:
        shutil.rmtree(state)
        shutil.copytree(saved, state)

    def incremental() -> None:
        found = materialize(root)
        assert (found.get("mode"), found.get("batches")) == ("incremental", new), found

    cases: dict[str, tuple[Callable[[], object], Callable[[], object] | None]] = {
        "ingest start-up": (lambda: start_up(LocalOutputFs(str(root)), str(root)), None),
        DELTA_OPEN: (lambda: ChangeTable(LocalOutputFs(str(root))).added(), None),
        f"incremental materialize ({new} new batches)": (incremental, restore),
        "status (summarize)": (lambda: summarize(str(root)), None),
        "batches (newest 20)": (lambda: batches(root), None),
    }
    if compact:
        packed = work / f"out{size}-compacted"
        shutil.copytree(root, packed)
        started = time.perf_counter()
        done = Compaction(CompactOptions(str(packed), min_age=0, grace=0)).compact()
        DeltaTable(str(packed / layout.CHANGES)).create_checkpoint()
        print(f"compacted {size:,} batches in {time.perf_counter() - started:.1f} s: {json.dumps(done.as_json())}",
              flush=True)
        cases["ingest start-up, compacted"] = (lambda: start_up(LocalOutputFs(str(packed)), str(packed)), None)
        cases[DELTA_OPEN + ", compacted"] = (lambda: ChangeTable(LocalOutputFs(str(packed))).added(), None)
    return cases


def main() -> None:
    """Build the outputs, measure (the sizes interleaved, so a change of load hits both alike), print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--new", type=int, default=5, help="batches published after the state was built")
    parser.add_argument("--compact", action="store_true", help="also measure a compacted copy of each output")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    work = Path(tempfile.mkdtemp(prefix="pgpoll-bench-history-"))
    runs: dict[tuple[str, int], list[float]] = {}
    calls: dict[tuple[str, int], Counter[str]] = {}
    try:
        cases = {size: prepare(work, size, args.new, args.compact) for size in sizes}
        for _ in range(args.repeat):
            for size, measurements in cases.items():
                for what, (fn, before) in measurements.items():
                    seconds, calls[(what, size)] = once(fn, before)
                    runs.setdefault((what, size), []).append(seconds)
        small, large = min(sizes), max(sizes)
        print(f"\nroutine commands at {small:,} and {large:,} committed batches; medians of {args.repeat} run(s); "
              f"(fastest in brackets); local disk; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        print(f"| command | {small:,} batches | {large:,} batches | ratio | metadata reads at {small:,} | "
              f"at {large:,} |")
        print("|---|---:|---:|---:|---:|---:|")
        for what in dict.fromkeys(k for k, _b in runs):
            if (what, small) in runs and (what, large) in runs:
                a, b = statistics.median(runs[(what, small)]), statistics.median(runs[(what, large)])
                fa, fb = min(runs[(what, small)]), min(runs[(what, large)])
                reads = (["(delta-rs)"] * 2 if what.startswith(DELTA_OPEN)
                         else [str(sum(calls[(what, n)].values())) for n in (small, large)])
                print(f"| {what} | {a * 1000:.1f} ms ({fa * 1000:.1f}) | {b * 1000:.1f} ms ({fb * 1000:.1f}) | "
                      f"{b / a:.2f}x ({fb / fa:.2f}x) | {reads[0]} | {reads[1]} |")
        print("\nmetadata reads of the last run: " + "; ".join(
            f"{what} at {size:,}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
            for (what, size), c in calls.items() if not what.startswith(DELTA_OPEN)))
    finally:
        shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
