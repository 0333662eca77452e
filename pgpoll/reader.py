"""Reading pgpoll's output: every committed change exactly once.

:func:`read_changes` reads only the partitions that the commit log lists, so
it never sees a batch that is still being published (on object stores, where
a rename is a copy, a plain ``spark.read.parquet(PATH + "/changes")`` could).
"""

from __future__ import annotations

from typing import Any

from pgpoll.sink import layout
from pgpoll.sink.commit_log import CommitLog
from pgpoll.sink.envelope import SPARK_DDL
from pgpoll.sink.filesystem import OutputFilesystem


def read_changes(spark: Any, path: str) -> Any:
    """A DataFrame of every committed change under ``path`` (with the ``lsn_range`` column).

    Order by ``commit_lsn, seq`` for source order.
    """
    fs = OutputFilesystem(spark, path)
    partitions = [r.partition for r in CommitLog(fs).records() if r.partition]
    if not partitions:
        return spark.createDataFrame([], SPARK_DDL + ", lsn_range string")
    base = fs.path(layout.CHANGES)
    return spark.read.option("basePath", base).parquet(*[f"{base}/{p}" for p in partitions])
