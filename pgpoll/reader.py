"""Reading pgpoll's output: every committed change exactly once, on any store.

The committed batches are what the change log's Delta table lists (plus any
record a crash left out of it: :func:`pgpoll.sink.change_table.committed_files`),
so a reader never sees a staged, losing or half-uploaded batch — on an
object store a plain listing of ``changes/lsn_range=*`` can. Files are read
with pyarrow through pgpoll's own store client: in the tasks of a Spark job
(:func:`read_changes`, no Hadoop connector needed) or in this process
(:func:`read_changes_arrow`).

The change log can have gaps: ranges of commits it lacks because its slot was
moved past it, marked by ``pgpoll resync`` (docs/reference/output-contract.md).
:func:`gaps` lists them, so a reader that needs every change can tell.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.sink import layout
from pgpoll.sink.change_table import TABLE_SCHEMA, committed_files
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.spark.arrow_files import conform


def _files(path: str) -> tuple[Any, list[str], list[dict[str, Any]]]:
    fs = open_output(path)
    found = committed_files(fs)
    paths = [fs.path(layout.CHANGES, partition, name) for partition, name, _size in found]
    partitions = [{"lsn_range": partition.split("=", 1)[1]} for partition, _name, _size in found]
    return fs, paths, partitions


def _moving(fs: Any) -> dict[str, str]:
    """Partition to staging directory of the newest records: on a local output a batch committed a moment ago (or
    by a run killed before it moved its files, until the next recovery) may still be there."""
    from pgpoll.sink.commit.log import CommitLog

    if fs.direct_writes:
        return {}
    return {r.partition: fs.path(layout.STAGING, r.staging) for r in CommitLog(fs).state().tail if r.partition and r.staging}


def _open(fs: Any, arrow: Any, file: str, staged: str | None) -> pq.ParquetFile:
    """A committed file, where it is now: its place, or still its staging (then its place again: moved between)."""
    if staged is not None:
        for candidate in (file, staged):
            try:
                return pq.ParquetFile(fs.arrow_path(candidate), filesystem=arrow)
            except FileNotFoundError:
                continue
    return pq.ParquetFile(fs.arrow_path(file), filesystem=arrow)


def gaps(path: str) -> list[dict[str, Any]]:
    """The gaps on record under ``path``, oldest first: ``{"seq", "after", "through", "replaced_through"}``, the
    changes with a ``commit_lsn`` in ``(after, through]`` are missing from the change log (every commit-log record is
    read). ``replaced_through`` is set for a gap of a new history (an unsafe failover, another system: the gap
    record's ``reason``): the batches before the gap with a ``commit_lsn`` in ``(after, replaced_through]`` hold
    changes the current source never had; None for a slot that was moved past the output."""
    from pgpoll.sink.commit.log import CommitLog

    return [{"seq": r.seq, "after": r.start, "through": r.resume, "replaced_through": r.end if r.new_history else None}
            for r in CommitLog(open_output(path)).records() if r.is_gap]


def read_changes(spark: Any, path: str) -> Any:
    """A DataFrame of every committed change under ``path`` (with the ``lsn_range`` column).

    Order by ``commit_lsn, seq`` for source order.
    """
    from pgpoll.spark.arrow_files import files_frame

    fs, paths, partitions = _files(path)
    return files_frame(spark, fs, paths, TABLE_SCHEMA, partitions)


def read_changes_arrow(path: str) -> pa.Table:
    """Every committed change under ``path`` as one Arrow table (with ``lsn_range``), read in this process."""
    fs, paths, partitions = _files(path)
    moving = _moving(fs)
    arrow = fs.arrow()
    batches: list[pa.RecordBatch] = []
    for file, constant in zip(paths, partitions, strict=True):
        partition = f"lsn_range={constant['lsn_range']}"
        staged = f"{moving[partition]}/{file.rsplit('/', 1)[1]}" if partition in moving else None
        for batch in _open(fs, arrow, file, staged).iter_batches():
            batch = batch.append_column("lsn_range", pa.array([constant["lsn_range"]] * batch.num_rows, pa.string()))
            batches.append(conform(batch, TABLE_SCHEMA))
    return pa.Table.from_batches(batches, schema=TABLE_SCHEMA)
