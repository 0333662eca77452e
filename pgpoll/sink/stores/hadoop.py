"""The output filesystem through Hadoop's ``FileSystem`` API, for the Spark driver.

The same ``FileSystem`` Spark writes the data files with, reached through the
SparkSession's JVM gateway (py4j), so every URI Spark can write works here.
Only the driver uses this module.

``rename`` of a directory is atomic on local filesystems and HDFS; on object
stores (S3, GCS, ABFS without hierarchical namespace) it is a copy and a
delete. :meth:`HadoopOutputFs.create_exclusive` is what the commit log's
compare-and-set rests on: for ``file:`` roots pgpoll does it with the OS
(Hadoop's local filesystem has no atomic create), for ``hdfs:``/``viewfs:``
through a rename that refuses an existing target, and elsewhere it is best
effort (``fenced`` is False).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from pgpoll.errors import SinkError, first_line
from pgpoll.sink.stores.local_files import ATOMIC_RENAME_SCHEMES, FENCED_SCHEMES, create_exclusive_local, local_path

T = TypeVar("T")


class HadoopOutputFs:
    """The Hadoop filesystem behind an output path (an :class:`pgpoll.sink.stores.filesystem.OutputFs`)."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._root_path = jvm.org.apache.hadoop.fs.Path(root)
        try:
            self._fs = self._root_path.getFileSystem(conf)
            self.root: str = self._fs.makeQualified(self._root_path).toString()
        except Exception as exc:  # py4j raises Py4JJavaError
            raise SinkError(f"cannot open output {root!r}: {first_line(exc)}", "check the --output path or URI") from None
        self.scheme: str = str(self._fs.getScheme()).lower()
        self.fenced: bool = self.scheme in FENCED_SCHEMES
        self.atomic_dir_rename: bool = self.scheme in ATOMIC_RENAME_SCHEMES
        self.direct_writes = False

    def path(self, *parts: str) -> str:
        """``root/part/part`` as a string."""
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def _p(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def exists(self, path: str) -> bool:
        """True when the file or directory exists."""
        return bool(self._call("check", path, lambda: self._fs.exists(self._p(path))))

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        self._call("create directory", path, lambda: self._fs.mkdirs(self._p(path)))

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree (no error when absent)."""
        self._call("delete", path, lambda: self._fs.delete(self._p(path), True))

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``; the parent of ``dst`` is created first; refused when ``dst`` exists.

        (Hadoop would move ``src`` *into* an existing directory ``dst``.)
        """
        if self.exists(dst):
            raise SinkError(f"cannot rename {src} to {dst}: the target exists", "check the output for leftovers")
        parent = self._p(dst).getParent()
        self._call("create directory", str(parent), lambda: self._fs.mkdirs(parent))
        ok = self._call("rename", src, lambda: self._fs.rename(self._p(src), self._p(dst)))
        if not ok:
            raise SinkError(f"could not rename {src} to {dst}", "check that the output is writable and the target does not exist")

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of each entry of a directory (empty when absent)."""
        if not self.exists(path):
            return []
        try:
            statuses = self._fs.listStatus(self._p(path))
        except Exception as exc:
            if "FileNotFoundException" in first_line(exc):
                return []  # removed between the check and the listing
            raise SinkError(f"cannot list {path}: {first_line(exc)}", "check that the output is reachable") from None
        return [(str(s.getPath().getName()), bool(s.isDirectory()), int(s.getLen())) for s in statuses]

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 file."""

        def read() -> str:
            stream = self._fs.open(self._p(path))
            try:
                reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
                lines = []
                line = reader.readLine()
                while line is not None:
                    lines.append(line)
                    line = reader.readLine()
                return "\n".join(lines)
            finally:
                stream.close()

        return str(self._call("read", path, read))

    def _write_new(self, path: str, text: str) -> None:
        def write() -> None:
            stream = self._fs.create(self._p(path), False)
            try:
                stream.write(bytearray(text.encode("utf-8")))
                stream.hflush()
            finally:
                stream.close()

        self._call("write", path, write)

    def _tmp_path(self, path: str) -> str:
        head, name = path.rsplit("/", 1)
        return f"{head}/_tmp.{uuid.uuid4().hex[:12]}.{name}"

    def write_text(self, path: str, text: str) -> None:
        """Write a small UTF-8 file atomically where the filesystem allows (temp file, then rename)."""
        tmp_path = self._tmp_path(path)
        self._write_new(tmp_path, text)
        if self.exists(path):
            self.delete(path)
        self.rename(tmp_path, path)

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create ``path`` only if absent (see :meth:`pgpoll.sink.stores.filesystem.OutputFs.create_exclusive`)."""
        if self.scheme == "file":
            local = local_path(path)
            if local is None:  # pragma: no cover (a qualified file: path always parses)
                raise SinkError(f"cannot map {path} to a local path", "use a local path or file: URI")
            return create_exclusive_local(local, text)
        if self.exists(path):
            return False
        tmp_path = self._tmp_path(path)
        self._write_new(tmp_path, text)
        # HDFS (and viewfs over it): rename refuses an existing target and returns False. Elsewhere this is
        # best effort (fenced is False): the check above and the rename are two steps.
        try:
            ok = self._call("rename", tmp_path, lambda: self._fs.rename(self._p(tmp_path), self._p(path)))
        finally:
            if self.exists(tmp_path):
                self.delete(tmp_path)
        return bool(ok)

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        """``(content, hash of the content)`` (None when absent)."""
        from pgpoll.sink.stores.local import content_tag

        if not self.exists(path):
            return None
        text = self.read_text(path)
        return text, content_tag(text)

    def swap(self, path: str, text: str, tag: str) -> bool:
        """Best effort compare-and-swap (a read, then a replace: Hadoop has no conditional write)."""
        current = self.read_tagged(path)
        if current is None or current[1] != tag:
            return False
        self.write_text(path, text)
        return True

    def arrow(self) -> Any:
        """Not available: pyarrow does not reach Hadoop's filesystems through the JVM."""
        raise SinkError(f"pgpoll cannot read {self.root} with pyarrow", "use a local path or an object-store URI")

    def arrow_path(self, path: str) -> str:
        """Paths as Hadoop names them."""
        return path

    def put_file(self, local: str, path: str) -> int:
        """Copy a local file into the output (Hadoop's ``copyFromLocalFile``)."""
        self._call("write", path, lambda: self._fs.copyFromLocalFile(False, True, self._p(local), self._p(path)))
        return int(self._call("check", path, lambda: self._fs.getFileStatus(self._p(path)).getLen()))

    def _call(self, what: str, path: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"cannot {what} {path}: {first_line(exc)}", "check that the output is reachable and writable"
            ) from None
