"""Driver-side file operations on the output, through Hadoop's FileSystem API.

pgpoll writes to a local path or any Hadoop filesystem URI (``file:``,
``hdfs:``, ``s3a:``, ``abfs:``...). The data files are written by Spark; the
small files pgpoll manages itself (commit-log records, manifests) and the
renames that publish a batch go through the same Hadoop ``FileSystem`` that
Spark uses, reached through the SparkSession's JVM gateway. Only the driver
calls this module.

``rename`` of a directory is atomic on local filesystems and HDFS; on object
stores (S3, GCS, ABFS without hierarchical namespace) it is a copy and delete.
pgpoll's readers rely on the commit log, not on renames, for what a batch is.
"""

from __future__ import annotations

from typing import Any

from pgpoll.errors import SinkError


class OutputFilesystem:
    """The Hadoop filesystem behind an output path."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._root_path = jvm.org.apache.hadoop.fs.Path(root)
        try:
            self._fs = self._root_path.getFileSystem(conf)
            self.root = self._fs.makeQualified(self._root_path).toString()
        except Exception as exc:  # py4j raises Py4JJavaError
            raise SinkError(f"cannot open output {root!r}: {_java_message(exc)}", "check the --output path or URI") from None

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
        """Rename ``src`` to ``dst``; the parent of ``dst`` is created first."""
        parent = self._p(dst).getParent()
        self._call("create directory", str(parent), lambda: self._fs.mkdirs(parent))
        ok = self._call("rename", src, lambda: self._fs.rename(self._p(src), self._p(dst)))
        if not ok:
            raise SinkError(f"could not rename {src} to {dst}", "check that the output is writable and the target does not exist")

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of each entry of a directory (empty when absent)."""
        if not self.exists(path):
            return []
        statuses = self._call("list", path, lambda: self._fs.listStatus(self._p(path)))
        return [(s.getPath().getName(), bool(s.isDirectory()), int(s.getLen())) for s in statuses]

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 file."""

        def read() -> str:
            stream = self._fs.open(self._p(path))
            try:
                reader = self._jvm.java.io.BufferedReader(
                    self._jvm.java.io.InputStreamReader(stream, "UTF-8")
                )
                lines = []
                line = reader.readLine()
                while line is not None:
                    lines.append(line)
                    line = reader.readLine()
                return "\n".join(lines)
            finally:
                stream.close()

        return str(self._call("read", path, read))

    def write_text(self, path: str, text: str) -> None:
        """Write a small UTF-8 file atomically where the filesystem allows (temp file, then rename)."""
        tmp = path.rsplit("/", 1)
        tmp_path = f"{tmp[0]}/_tmp.{tmp[1]}"

        def write() -> None:
            stream = self._fs.create(self._p(tmp_path), True)
            try:
                stream.write(bytearray(text.encode("utf-8")))
                stream.hflush()
            finally:
                stream.close()

        self._call("write", tmp_path, write)
        if self.exists(path):
            self.delete(path)
        self.rename(tmp_path, path)

    def _call(self, what: str, path: str, fn: Any) -> Any:
        try:
            return fn()
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"cannot {what} {path}: {_java_message(exc)}", "check that the output is reachable and writable"
            ) from None


def _java_message(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return str(java.toString())
        except Exception:  # pragma: no cover
            pass
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
