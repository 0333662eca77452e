"""Output filesystems: what an object store needs on the classpath, and local paths checked before Spark starts.

Spark reaches ``s3a://``, ``gs://`` and ``abfs://`` through Hadoop filesystem
classes that are not part of Spark's own jars. Without them the first write
fails with ``ClassNotFoundException: ...S3AFileSystem`` or ``No FileSystem for
scheme "s3a"``, which does not say which jar is missing: :func:`connector_hint`
turns such an error into the connector to add.

A local output path that cannot work (below a regular file, in a directory
the user may not write) otherwise fails only after Spark's start-up, many
seconds later: :func:`check_local_output` finds it first, without a JVM.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from pgpoll.errors import SinkError

__all__ = ["Connector", "check_local_output", "connector_hint", "local_output_problem"]

_HADOOP_VERSION = "the Hadoop version of your Spark (the version in its jars/hadoop-client-api-*.jar)"


@dataclass(frozen=True)
class Connector:
    """A Hadoop filesystem connector: its schemes, its classes, and how to put it on the classpath."""

    name: str
    schemes: tuple[str, ...]
    classes: tuple[str, ...]
    jars: str


CONNECTORS = (
    Connector(
        "Hadoop's S3 connector (S3A)",
        ("s3a",),
        ("org.apache.hadoop.fs.s3a.S3AFileSystem",),
        "hadoop-aws and the AWS SDK bundle it was built with: spark-submit --packages "
        f"org.apache.hadoop:hadoop-aws:<version> (the SDK bundle comes with it), <version> being {_HADOOP_VERSION}; "
        "or copy hadoop-aws-<version>.jar and the matching software.amazon.awssdk bundle-*.jar into $SPARK_HOME/jars",
    ),
    Connector(
        "Google's Cloud Storage connector",
        ("gs",),
        ("com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem", "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS"),
        "gcs-connector: spark-submit --jars gcs-connector-hadoop3-<version>-shaded.jar "
        "(or --packages com.google.cloud.bigdataoss:gcs-connector:hadoop3-<version>), or copy the shaded jar "
        "into $SPARK_HOME/jars",
    ),
    Connector(
        "Hadoop's Azure connector (ABFS)",
        ("abfs", "abfss", "wasb", "wasbs"),
        ("org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem", "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem",
         "org.apache.hadoop.fs.azure.NativeAzureFileSystem", "org.apache.hadoop.fs.azure.NativeAzureFileSystem$Secure"),
        f"hadoop-azure: spark-submit --packages org.apache.hadoop:hadoop-azure:<version>, <version> being {_HADOOP_VERSION}; "
        "or copy hadoop-azure-<version>.jar into $SPARK_HOME/jars",
    ),
)

_NO_SCHEME = re.compile(r'No FileSystem for scheme:?\s*"?([A-Za-z][A-Za-z0-9+.-]*)"?')
_MISSING_CLASS = re.compile(r"(?:ClassNotFoundException|NoClassDefFoundError)|Class \S+ not found")


def _scheme(uri: str) -> str:
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
    return match.group(1).lower() if match else ""


def connector_hint(error_text: str, uri: str) -> str | None:
    """The fix for a missing Hadoop filesystem in ``error_text`` (a Spark/Hadoop error), or None.

    ``uri`` is the output (or input) the failing job used; it names the scheme
    when the error does not. Returns None for any other error.
    """
    named = _NO_SCHEME.search(error_text)
    missing_class = next((c for conn in CONNECTORS for c in conn.classes if c in error_text), None)
    if named is None and (missing_class is None or not _MISSING_CLASS.search(error_text)):
        return None
    scheme = named.group(1).lower() if named else _scheme(uri)
    for connector in CONNECTORS:
        if (missing_class is not None and missing_class in connector.classes) or scheme in connector.schemes:
            return f"{uri} needs {connector.name} on the Spark classpath of the driver and every executor: {connector.jars}"
    if scheme in ("s3", "s3n"):
        return f"Hadoop has no {scheme}:// filesystem: write {uri} as s3a://... and add {CONNECTORS[0].jars}"
    if named:
        return f'no Hadoop filesystem handles "{scheme}://" ({uri}): add its connector jar to the Spark classpath'
    return None


def _local_path(output: str) -> Path | None:
    """The local path of ``output`` (a plain path or a ``file:`` URI), or None for any other scheme."""
    if output.startswith("file:"):
        return Path(unquote(urlparse(output).path) or "/")
    scheme = _scheme(output)
    if scheme and len(scheme) > 1:  # a one-letter "scheme" is a Windows drive
        return None
    return Path(output)


def local_output_problem(output: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a local ``output`` that cannot be written, or None.

    Other schemes are not checked (None). Looks only at the filesystem: the
    path itself, or its nearest existing ancestor when it does not exist yet.
    """
    path = _local_path(output)
    if path is None:
        return None
    path = Path(os.path.abspath(path))
    if path.exists():
        if not path.is_dir():
            return (f"output {output} is a regular file, not a directory",
                    "choose another --output: pgpoll writes a directory tree there")
        if not os.access(path, os.W_OK | os.X_OK):
            return (f"output {output} is not writable by this user",
                    f"give the user running pgpoll write permission on {path}, or choose another --output")
        return None
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return (f"cannot create output {output}: {ancestor} is a regular file, not a directory",
                "choose an --output whose parent directories are directories")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"cannot create output {output}: {ancestor} is not writable by this user",
                f"create {path} as a user who may, and give the user running pgpoll write permission on it, "
                "or choose another --output")
    return None


def check_local_output(output: str) -> None:
    """Raise :class:`SinkError` (exit 5) when a local ``output`` cannot be written; see :func:`local_output_problem`."""
    problem = local_output_problem(output)
    if problem is not None:
        raise SinkError(*problem)
