"""Opening an output: the :class:`~pgpoll.sink.stores.output_fs.OutputFs` of a local path, an object store or Hadoop.

:func:`open_output` is the one place that decides which implementation an
output gets (see :mod:`pgpoll.sink.stores.output_fs` for the Protocol and what each
store guarantees):

* local paths and ``file:`` URIs: :class:`pgpoll.sink.stores.local.LocalOutputFs`;
* ``s3://``/``s3a://``, ``gs://``, ``az://``/``abfss://``: :class:`pgpoll.sink.stores.object_store.ObjectStoreOutputFs`,
  with pgpoll's own client (no Spark, no Hadoop connector);
* anything else (``hdfs:``, ``viewfs:``...): Hadoop's filesystem through the
  SparkSession (:class:`pgpoll.sink.stores.hadoop.HadoopOutputFs`; without one,
  ``pyarrow.fs`` where it can open the URI, unfenced).
"""

from __future__ import annotations

import uuid
from typing import Any

from pgpoll.sink.stores.config import is_store_url
from pgpoll.sink.stores.local_files import (  # re-exported: the helpers every implementation shares
    ATOMIC_RENAME_SCHEMES,
    FENCED_SCHEMES,
    create_exclusive_local,
    local_path,
)
from pgpoll.sink.stores.output_fs import OutputFs

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
        from pgpoll.sink.stores.local import LocalOutputFs

        return LocalOutputFs(local_path(output) or output)
    if is_store_url(output):
        from pgpoll.sink.stores.object_store import ObjectStoreOutputFs

        return ObjectStoreOutputFs(output)
    if spark is not None:
        from pgpoll.sink.stores.hadoop import HadoopOutputFs

        return HadoopOutputFs(spark, output)
    from pgpoll.sink.stores.local import ArrowOutputFs

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
