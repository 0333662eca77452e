"""The output filesystem: one small Protocol that the commit log and publishing are written against.

pgpoll writes to a local path or any Hadoop filesystem URI (``file:``,
``hdfs:``, ``s3a:``, ``abfs:``...). Spark writes the data files; the small
files pgpoll manages itself (commit-log records, checkpoints, plans, the
lease) and the moves that publish a batch go through an :class:`OutputFs`:

* :class:`pgpoll.sink.hadoop_fs.HadoopOutputFs` — Hadoop's ``FileSystem``
  reached through the SparkSession's JVM gateway, the one Spark itself uses
  (the ingest driver, ``materialize``, :mod:`pgpoll.reader`);
* :class:`pgpoll.sink.local_fs.LocalOutputFs` (local paths and ``file:``
  URIs, with the OS) and :class:`pgpoll.sink.local_fs.ArrowOutputFs` (other
  URIs through ``pyarrow.fs``) — no JVM: ``pgpoll status``, monitors, and
  the unit tests of publishing and recovery.

Exactly once rests on one operation, :meth:`OutputFs.create_exclusive`: write
a small file only if it does not exist yet, atomically (the compare-and-set
of the commit log). Where the store provides it ``fenced`` is True:

============  ==========================================================
``file:``     pgpoll itself, with the OS: temp file, then ``link(2)`` to
              the final name, which fails when it exists (Hadoop's local
              filesystem has no atomic create)
``hdfs:``     Hadoop ``rename``, which refuses an existing target
``viewfs:``   the same, on the mounted HDFS
others        not fenced (``s3a:``, ``gs:``, ``abfs:``...): best effort,
              the lease is then the only guard; a warning says so
============  ==========================================================
"""

from __future__ import annotations

from typing import Any, Protocol

from pgpoll.sink.local_files import (  # re-exported: the helpers every implementation shares
    ATOMIC_RENAME_SCHEMES,
    FENCED_SCHEMES,
    create_exclusive_local,
    local_path,
)

__all__ = [
    "ATOMIC_RENAME_SCHEMES",
    "FENCED_SCHEMES",
    "OutputFilesystem",
    "OutputFs",
    "create_exclusive_local",
    "local_path",
    "open_output",
]

class OutputFs(Protocol):
    """The operations pgpoll needs on an output path.

    Paths are strings made by :meth:`path`; an implementation only ever gets
    back paths it made. ``list`` and ``delete`` of an absent path are not
    errors; every other failure is a :class:`pgpoll.errors.SinkError`.
    """

    root: str
    scheme: str
    fenced: bool
    atomic_dir_rename: bool

    def path(self, *parts: str) -> str:
        """``root/part/part``."""
        ...

    def exists(self, path: str) -> bool:
        """True when the file or directory exists."""
        ...

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        ...

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree (no error when absent)."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (the parent of ``dst`` is created); SinkError when it fails or ``dst`` exists."""
        ...

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of each entry of a directory (empty when absent)."""
        ...

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 file."""
        ...

    def write_text(self, path: str, text: str) -> None:
        """Write (or replace) a small UTF-8 file, atomically where the store allows."""
        ...

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create ``path`` with ``text`` only if it does not exist: True when this call created it.

        Atomic when ``fenced``: of any number of racing callers exactly one
        gets True, and a reader never sees the file partly written.
        """
        ...


def open_output(output: str, spark: Any = None) -> OutputFs:
    """The filesystem of ``output``: Hadoop's with a SparkSession, else the local/pyarrow one."""
    if spark is not None:
        from pgpoll.sink.hadoop_fs import HadoopOutputFs

        return HadoopOutputFs(spark, output)
    from pgpoll.sink.local_fs import open_local

    return open_local(output)


def OutputFilesystem(spark: Any, root: str) -> OutputFs:  # noqa: N802 (the former class name, kept for callers)
    """Hadoop's filesystem behind ``root`` (what :func:`open_output` gives with a SparkSession)."""
    return open_output(root, spark)
