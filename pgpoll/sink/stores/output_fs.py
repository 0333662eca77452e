"""The output filesystem: one small Protocol that the commit log, publishing, leases and snapshots are written against.

Implementations (chosen by :func:`pgpoll.sink.stores.filesystem.open_output`):

* :class:`pgpoll.sink.stores.local.LocalOutputFs`: local paths and ``file:`` URIs, through the OS;
* :class:`pgpoll.sink.stores.object_store.ObjectStoreOutputFs`: ``s3://`` (and ``s3a://``), ``gs://``, ``az://`` /
  ``abfss://``, through pgpoll's own object-store client (obstore): no Hadoop connector, no JVM;
* :class:`pgpoll.sink.stores.hadoop.HadoopOutputFs`: any other Hadoop filesystem URI (``hdfs:``, ``viewfs:``...),
  through the SparkSession's JVM.

Exactly once rests on one operation, :meth:`OutputFs.create_exclusive`: write
a small file only if it does not exist yet, atomically (the compare-and-set
of the commit log). Where the store provides it ``fenced`` is True:

============  ==========================================================
``file:``     the OS: a temp file, then ``link(2)`` to the final name, which
              fails when it exists
``s3:``       ``PUT`` with ``If-None-Match: *`` (412 for the loser)
``az:``       ``PUT`` with ``If-None-Match: *`` (409/412 for the loser)
``gs:``       an upload with ``ifGenerationMatch=0`` (untested here: no
              emulator honours it)
``hdfs:``     Hadoop ``rename``, which refuses an existing target
``viewfs:``   the same, on the mounted HDFS
others        not fenced: best effort, the lease is then the only guard;
              a warning says so
============  ==========================================================

:meth:`OutputFs.swap` is the compare-and-swap of a small file that may be
replaced (the lease): atomic on object stores (``If-Match`` on the ETag, on
GCS the generation) and on local filesystems (under a lock file); best
effort through Hadoop.

``direct_writes`` says how a batch's data files reach their place: on
object stores they are written once at their final key (a copy there is a
full rewrite, and no rename exists), elsewhere into staging and then moved
with one directory rename.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow.fs as pafs


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
    direct_writes: bool

    def path(self, *parts: str) -> str:
        """``root/part/part``."""
        ...

    def exists(self, path: str) -> bool:
        """True when the file or directory exists."""
        ...

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents (nothing to do on an object store)."""
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

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        """``(content, tag)`` of a small file (None when absent); ``tag`` changes whenever the file is replaced."""
        ...

    def swap(self, path: str, text: str, tag: str) -> bool:
        """Replace ``path`` with ``text`` only if its tag is still ``tag``: True when this call replaced it."""
        ...

    def arrow(self) -> pafs.FileSystem:
        """A ``pyarrow.fs`` filesystem that reads and writes the output's files (paths: :meth:`arrow_path`)."""
        ...

    def arrow_path(self, path: str) -> str:
        """``path`` as :meth:`arrow`'s filesystem names it."""
        ...

    def put_file(self, local: str, path: str) -> int:
        """Copy the local file ``local`` to ``path`` (one upload on an object store); returns its size."""
        ...
