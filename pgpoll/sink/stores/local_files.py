"""OS-level operations on a local output: the atomic create-if-absent, and which schemes are fenced.

Shared by every :class:`pgpoll.sink.stores.filesystem.OutputFs` implementation (the
Hadoop one too: Hadoop's local filesystem has no atomic create, so for
``file:`` outputs pgpoll does it itself with the OS). Kept apart from the
Protocol module so that the implementations import it without importing the
factory that imports them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from urllib.parse import urlparse

from pgpoll.errors import SinkError, first_line

FENCED_SCHEMES = frozenset({"file", "hdfs", "viewfs"})
"""Schemes whose ``create_exclusive`` is atomic (see the module docstring)."""

ATOMIC_RENAME_SCHEMES = frozenset({"file", "hdfs", "viewfs"})
"""Schemes where renaming a directory is atomic (readers see all of it or none)."""


def local_path(path: str) -> str | None:
    """The OS path of a local path or ``file:`` URI; None for any other URI."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return path
    return None


def create_exclusive_local(path: str, text: str) -> bool:
    """Atomic create-if-absent on a local filesystem (see :meth:`OutputFs.create_exclusive`).

    The content goes to a temp file in the same directory first (fsynced),
    then ``os.link`` gives it the final name: the link fails with
    ``FileExistsError`` when the name exists, so the check and the create are
    one step, and the file appears complete. On a filesystem without hard
    links it falls back to ``O_CREAT | O_EXCL`` (still exclusive; a crash
    while writing those few bytes could leave the file short).
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f"_tmp.{uuid.uuid4().hex}.{os.path.basename(path)}")
    data = text.encode("utf-8")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            return _create_excl(path, data)
        _fsync_dir(directory)
        return True
    except OSError as exc:
        raise SinkError(f"cannot create {path}: {first_line(exc)}", "check that the output is writable") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _create_excl(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover (platforms without directory handles)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
