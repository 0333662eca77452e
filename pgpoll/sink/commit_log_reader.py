"""Read an output's commit log without Spark, for ``pgpoll status`` and monitors.

The ingest job writes the commit log through Hadoop's FileSystem
(:mod:`pgpoll.sink.commit_log`); this module reads the same JSON records with
``pyarrow.fs`` instead, so a monitor can check an output in a fraction of a
second without starting a JVM. Local paths and ``file:`` URIs always work;
other URIs work as far as ``pyarrow.fs`` supports them (``s3://`` — an
``s3a://`` URI is read as ``s3://`` —, ``gs://``, and ``hdfs://`` where
libhdfs is installed).

Only the commit log is read, never the data files.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlparse

from pgpoll.errors import SinkError
from pgpoll.lsn import Lsn
from pgpoll.sink import layout
from pgpoll.sink.commit_log import CommitRecord

if TYPE_CHECKING:
    import pyarrow.fs as pafs


@dataclass(frozen=True)
class CommitLogSummary:
    """What an output's commit log says, for status reports.

    ``high_water_mark`` is the largest ``end`` (where the slot was last
    advanced to); ``last_commit_ts`` is the newest commit time of any change
    written (None until a batch wrote a row); ``slots`` are the slot names the
    records carry (one, unless the output was fed by a recreated slot).
    """

    output: str
    records: int
    rows: int
    high_water_mark: Optional[Lsn]
    last_commit_ts: Optional[datetime]
    last_committed_at: Optional[datetime]
    slots: tuple[str, ...]


def _filesystem(output: str) -> tuple["pafs.FileSystem", str]:
    """The pyarrow filesystem and the path of the commit-log directory under ``output``."""
    import pyarrow.fs as pafs  # imported here: only status and monitors need it

    parsed = urlparse(output)
    scheme = parsed.scheme
    if scheme in ("", "file"):
        root = Path(parsed.path if scheme == "file" else output).expanduser().resolve()
        return pafs.LocalFileSystem(), f"{root}/{layout.COMMITS}"
    uri = "s3://" + output[len("s3a://"):] if scheme == "s3a" else output
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError or NotImplementedError
        raise SinkError(
            f"cannot open output {output!r} without Spark: {_first_line(exc)}",
            "use a local path or file: URI, or a URI pyarrow.fs can open (s3://, gs://, hdfs:// with libhdfs)",
        ) from None
    return fs, f"{path.rstrip('/')}/{layout.COMMITS}"


def read_records(output: str) -> list[CommitRecord]:
    """Every commit-log record under ``output``, in LSN order (empty for a new output)."""
    import pyarrow.fs as pafs

    fs, directory = _filesystem(output)
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except Exception as exc:
        raise SinkError(f"cannot list {directory}: {_first_line(exc)}", "check the --output path and that it is readable") from None
    records: list[CommitRecord] = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json") or info.base_name.startswith("_"):
            continue  # "_tmp.<end>.json" is a record being written
        try:
            with fs.open_input_stream(info.path) as stream:
                text = stream.read().decode("utf-8")
        except FileNotFoundError:
            continue  # replaced between listing and reading (a run is writing)
        except Exception as exc:
            raise SinkError(f"cannot read {info.path}: {_first_line(exc)}", "check that the output is readable") from None
        records.append(CommitRecord.parse(text, info.path))
    return sorted(records, key=lambda r: r.end_lsn)


def summarize(output: str) -> CommitLogSummary:
    """High-water mark, newest commit time and totals of the commit log under ``output``."""
    records = read_records(output)
    commit_times = [_timestamp(r.last_commit_ts) for r in records if r.last_commit_ts]
    committed = [_timestamp(r.committed_at) for r in records if r.committed_at]
    return CommitLogSummary(
        output=output,
        records=len(records),
        rows=sum(r.rows for r in records),
        high_water_mark=records[-1].end_lsn if records else None,
        last_commit_ts=max(commit_times) if commit_times else None,
        last_committed_at=max(committed) if committed else None,
        slots=tuple(sorted({r.slot for r in records})),
    )


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SinkError(f"commit-log timestamp {text!r} is not ISO 8601", "check the commit-log records") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
