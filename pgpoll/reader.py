"""Reading pgpoll's output: every committed change exactly once.

:func:`read_changes` reads only the partitions that the commit log names
(its newest checkpoint and the records after it), so it never sees a
partition no record names — a leftover of an older pgpoll's crash — and,
on object stores where a move is a copy, never a batch that is still being
moved into place.
"""

from __future__ import annotations

from typing import Any

from pgpoll.sink import layout
from pgpoll.sink.commit_log import CommitLog
from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.filesystem import open_output


def read_changes(spark: Any, path: str) -> Any:
    """A DataFrame of every committed change under ``path`` (with the ``lsn_range`` column).

    Order by ``commit_lsn, seq`` for source order.
    """
    fs = open_output(path, spark)
    partitions = [p for p, _tables in CommitLog(fs).state().partitions()]
    if not partitions:
        return spark.createDataFrame([], SPARK_DDL + ", lsn_range string")
    base = fs.path(layout.CHANGES)
    return spark.read.option("basePath", base).parquet(*[f"{base}/{p}" for p in partitions])
