"""The output filesystem on a local disk (the OS), and ``pyarrow.fs`` for URIs Hadoop would otherwise open.

Local paths and ``file:`` URIs support everything, fenced
(:func:`create_exclusive_local`), with an atomic compare-and-swap of small
files (:meth:`LocalOutputFs.swap`, under a lock on their directory). Other
URIs without a SparkSession (``hdfs://`` where libhdfs is installed) work as
far as ``pyarrow.fs`` supports them and are never fenced from here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlparse

from pgpoll.errors import SinkError, first_line
from pgpoll.sink.stores.local_files import create_exclusive_local, local_path

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow.fs as pafs

    from pgpoll.sink.stores.output_fs import OutputFs

T = TypeVar("T")


def open_local(output: str) -> OutputFs:
    """A :class:`LocalOutputFs` for local paths and ``file:`` URIs, else an :class:`ArrowOutputFs`."""
    local = local_path(output)
    if local is not None:
        return LocalOutputFs(local)
    return ArrowOutputFs(output)


def content_tag(text: str, extra: str = "") -> str:
    """The tag :meth:`OutputFs.read_tagged` gives a file with this content (where the store has no ETag)."""
    return hashlib.sha256((extra + "\0" + text).encode("utf-8")).hexdigest()[:32]


@contextlib.contextmanager
def _directory_lock(directory: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` (other pgpoll processes on this host wait for it)."""
    os.makedirs(directory, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _os_call(what: str, path: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except OSError as exc:
        raise SinkError(f"cannot {what} {path}: {first_line(exc)}", "check that the output is reachable and writable") from None


class LocalOutputFs:
    """An output on a local filesystem, through the OS (fenced)."""

    scheme = "file"
    fenced = True
    atomic_dir_rename = True
    direct_writes = False

    def __init__(self, root: str) -> None:
        self.root = str(Path(root).expanduser().resolve())

    def path(self, *parts: str) -> str:
        """``root/part/part``."""
        return "/".join([self.root.rstrip("/") or "/", *[p.strip("/") for p in parts if p]]).replace("//", "/")

    def exists(self, path: str) -> bool:
        """True when the file or directory exists."""
        return os.path.lexists(path)

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        _os_call("create directory", path, lambda: os.makedirs(path, exist_ok=True))

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree (no error when absent)."""

        def remove() -> None:
            for _attempt in range(5):  # another process may be removing the same tree
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                    return
                except FileNotFoundError:
                    if not os.path.lexists(path):
                        return
                except OSError as exc:  # a writer added a file meanwhile: go again
                    if exc.errno != errno.ENOTEMPTY or _attempt == 4:
                        raise

        _os_call("delete", path, remove)

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (parent created); SinkError when ``dst`` exists or ``src`` is absent."""
        if os.path.lexists(dst):
            raise SinkError(f"cannot rename {src} to {dst}: the target exists", "check the output for leftovers")
        _os_call("create directory", dst, lambda: os.makedirs(os.path.dirname(dst), exist_ok=True))
        _os_call("rename", src, lambda: os.rename(src, dst))

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of each entry of a directory (empty when absent)."""

        def scan() -> list[tuple[str, bool, int]]:
            out: list[tuple[str, bool, int]] = []
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                            out.append((entry.name, is_dir, 0 if is_dir else entry.stat(follow_symlinks=False).st_size))
                        except FileNotFoundError:
                            continue  # removed while listing
            except (FileNotFoundError, NotADirectoryError):
                return []
            return out

        return _os_call("list", path, scan)

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 file."""
        return _os_call("read", path, lambda: Path(path).read_text(encoding="utf-8"))

    def write_text(self, path: str, text: str) -> None:
        """Write a small UTF-8 file atomically (temp file, then ``os.replace``)."""
        tmp = os.path.join(os.path.dirname(path), f"_tmp.{uuid.uuid4().hex[:12]}.{os.path.basename(path)}")

        def write() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)

        _os_call("write", path, write)

    def create_exclusive(self, path: str, text: str) -> bool:
        """Atomic create-if-absent (see :func:`pgpoll.sink.stores.filesystem.create_exclusive_local`)."""
        return create_exclusive_local(path, text)

    def _tagged(self, path: str) -> tuple[str, str] | None:
        try:
            with open(path, encoding="utf-8") as handle:
                stat = os.fstat(handle.fileno())
                text = handle.read()
        except FileNotFoundError:
            return None
        return text, content_tag(text, f"{stat.st_ino}:{stat.st_mtime_ns}")

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        """``(content, tag)``; the tag covers the content and the file's identity (every replace is a new file)."""
        return _os_call("read", path, lambda: self._tagged(path))

    def swap(self, path: str, text: str, tag: str) -> bool:
        """Compare-and-swap under an exclusive lock on the file's directory (every writer takes it)."""

        def swap() -> bool:
            with _directory_lock(os.path.dirname(path)):
                current = self._tagged(path)
                if current is None or current[1] != tag:
                    return False
                self.write_text(path, text)
                return True

        return _os_call("replace", path, swap)

    def arrow(self) -> pafs.FileSystem:
        """pyarrow's local filesystem."""
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem()

    def arrow_path(self, path: str) -> str:
        """The OS path itself."""
        return path

    def put_file(self, local: str, path: str) -> int:
        """Copy a local file into the output."""

        def copy() -> int:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.copyfile(local, path)
            return os.path.getsize(path)

        return _os_call("write", path, copy)


class ArrowOutputFs:
    """An output on any store ``pyarrow.fs`` opens (never fenced from here)."""

    fenced = False
    atomic_dir_rename = False
    direct_writes = False

    def __init__(self, output: str) -> None:
        import pyarrow.fs as pafs  # imported here: only status and monitors on remote outputs need it

        self._pafs = pafs
        parsed = urlparse(output)
        self.scheme = parsed.scheme.lower()
        uri = "s3://" + output[len("s3a://"):] if self.scheme == "s3a" else output
        try:
            fs, root = pafs.FileSystem.from_uri(uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError or NotImplementedError
            raise SinkError(
                f"cannot open output {output!r} without Spark: {first_line(exc)}",
                "use a local path or file: URI, or a URI pyarrow.fs can open (s3://, gs://, hdfs:// with libhdfs)",
            ) from None
        self._fs: pafs.FileSystem = fs
        self.root = root.rstrip("/")

    def path(self, *parts: str) -> str:
        """``root/part/part``."""
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def _call(self, what: str, path: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(f"cannot {what} {path}: {first_line(exc)}", "check that the output is reachable") from None

    def _info(self, path: str) -> pafs.FileInfo:
        return self._call("check", path, lambda: self._fs.get_file_info(path))

    def exists(self, path: str) -> bool:
        """True when the file or directory exists."""
        return bool(self._info(path).type != self._pafs.FileType.NotFound)

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        self._call("create directory", path, lambda: self._fs.create_dir(path, recursive=True))

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree (no error when absent)."""
        kind = self._info(path).type
        if kind == self._pafs.FileType.Directory:
            self._call("delete", path, lambda: self._fs.delete_dir(path))
        elif kind != self._pafs.FileType.NotFound:
            self._call("delete", path, lambda: self._fs.delete_file(path))

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (a copy and a delete on object stores); refused when ``dst`` exists."""
        if self.exists(dst):
            raise SinkError(f"cannot rename {src} to {dst}: the target exists", "check the output for leftovers")
        self._call("rename", src, lambda: self._fs.move(src, dst))

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of each entry of a directory (empty when absent)."""
        selector = self._pafs.FileSelector(path, allow_not_found=True)
        infos = self._call("list", path, lambda: self._fs.get_file_info(selector))
        return [
            (i.base_name, i.type == self._pafs.FileType.Directory, int(i.size or 0))
            for i in infos
            if i.type != self._pafs.FileType.NotFound
        ]

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 file."""

        def read() -> str:
            with self._fs.open_input_stream(path) as stream:
                return bytes(stream.read()).decode("utf-8")

        return self._call("read", path, read)

    def write_text(self, path: str, text: str) -> None:
        """Write a small UTF-8 file (one PUT on object stores)."""

        def write() -> None:
            with self._fs.open_output_stream(path) as stream:
                stream.write(text.encode("utf-8"))

        self._call("write", path, write)

    def create_exclusive(self, path: str, text: str) -> bool:
        """Best effort create-if-absent (not atomic: ``fenced`` is False)."""
        if self.exists(path):
            return False
        self.write_text(path, text)
        return True

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        """``(content, hash of the content)`` (None when absent)."""
        if not self.exists(path):
            return None
        text = self.read_text(path)
        return text, content_tag(text)

    def swap(self, path: str, text: str, tag: str) -> bool:
        """Best effort compare-and-swap (a read, then a write: not atomic here)."""
        current = self.read_tagged(path)
        if current is None or current[1] != tag:
            return False
        self.write_text(path, text)
        return True

    def arrow(self) -> pafs.FileSystem:
        """The ``pyarrow.fs`` filesystem itself."""
        return self._fs

    def arrow_path(self, path: str) -> str:
        """Paths are already the filesystem's."""
        return path

    def put_file(self, local: str, path: str) -> int:
        """Copy a local file into the output."""
        self._call("write", path, lambda: self._pafs.copy_files(local, path, destination_filesystem=self._fs))
        return int(self._info(path).size or 0)
