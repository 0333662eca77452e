"""Opening an output: the :class:`~pgpoll.sink.output_fs.OutputFs` of a local path, an object store or Hadoop.

:func:`open_output` is the one place that decides which implementation an
output gets (see :mod:`pgpoll.sink.output_fs` for the Protocol and what each
store guarantees):

* local paths and ``file:`` URIs: :class:`pgpoll.sink.local_fs.LocalOutputFs`;
* ``s3://``/``s3a://``, ``gs://``, ``az://``/``abfss://``: :class:`pgpoll.sink.object_fs.ObjectStoreOutputFs`,
  with pgpoll's own client (no Spark, no Hadoop connector);
* anything else (``hdfs:``, ``viewfs:``...): Hadoop's filesystem through the
  SparkSession (:class:`pgpoll.sink.hadoop_fs.HadoopOutputFs`; without one,
  ``pyarrow.fs`` where it can open the URI, unfenced).
"""

from __future__ import annotations

import uuid
from typing import Any

from pgpoll.sink.local_files import (  # re-exported: the helpers every implementation shares
    ATOMIC_RENAME_SCHEMES,
    FENCED_SCHEMES,
    create_exclusive_local,
    local_path,
)
from pgpoll.sink.output_fs import OutputFs
from pgpoll.sink.store_config import is_store_url

__all__ = [
    "ATOMIC_RENAME_SCHEMES",
    "FENCED_SCHEMES",
    "OutputFilesystem",
    "OutputFs",
    "check_readable",
    "check_writable",
    "create_exclusive_local",
    "local_path",
    "needs_spark",
    "open_output",
]


def needs_spark(output: str) -> bool:
    """True when ``output`` is reached only through Hadoop's filesystem (not local, not an object store)."""
    return local_path(output) is None and not is_store_url(output)


def open_output(output: str, spark: Any = None) -> OutputFs:
    """The filesystem of ``output`` (see the module docstring); ``spark`` is used only where Hadoop is needed."""
    if local_path(output) is not None:
        from pgpoll.sink.local_fs import LocalOutputFs

        return LocalOutputFs(local_path(output) or output)
    if is_store_url(output):
        from pgpoll.sink.object_fs import ObjectStoreOutputFs

        return ObjectStoreOutputFs(output)
    if spark is not None:
        from pgpoll.sink.hadoop_fs import HadoopOutputFs

        return HadoopOutputFs(spark, output)
    from pgpoll.sink.local_fs import ArrowOutputFs

    return ArrowOutputFs(output)


def OutputFilesystem(spark: Any, root: str) -> OutputFs:  # noqa: N802 (the former class name, kept for callers)
    """The filesystem behind ``root`` (what :func:`open_output` gives)."""
    return open_output(root, spark)


def check_writable(fs: OutputFs) -> None:
    """Fail early (SinkError, exit 5) when the output cannot be written: a probe file written and removed.

    On an object store with a client that gives up within seconds (a wrong
    secret, a missing bucket, a stopped endpoint), not after the patient
    retries of a run's requests; nothing is left behind.
    """
    quick = getattr(fs, "quick", None)
    probe_fs: OutputFs = quick() if quick is not None else fs
    probe_fs.mkdirs(probe_fs.path("_pgpoll"))
    probe = probe_fs.path("_pgpoll", f"_probe-{uuid.uuid4().hex}.json")
    probe_fs.write_text(probe, "pgpoll")
    probe_fs.delete(probe)


def check_readable(fs: OutputFs) -> None:
    """Fail early (SinkError, exit 5) when the output cannot be read: one listing, through a client that gives
    up within seconds on an object store (read-only commands: ``status``, ``batches``, materialize's input)."""
    quick = getattr(fs, "quick", None)
    probe_fs: OutputFs = quick() if quick is not None else fs
    probe_fs.list(probe_fs.path("_pgpoll"))
