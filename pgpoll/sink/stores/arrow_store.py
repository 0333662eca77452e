"""A ``pyarrow.fs`` filesystem over an obstore client: Arrow reads and writes Parquet on any store pgpoll reaches.

pyarrow has its own S3, GCS and Azure filesystems, each configured its own
way (and Azure's not at all from the variables the Azure tools read).
pgpoll configures one client per store (:mod:`pgpoll.sink.stores.config`)
and hands pyarrow this adapter, so Parquet files are read and written with
exactly the settings, retries and timeouts of pgpoll's own requests.

Paths are ``<bucket>/<key>`` (as pyarrow's own S3 filesystem names them).
Reads are ranged GETs through a buffered reader (a Parquet footer, then
the column chunks); writes are one buffered upload (multipart for large
files) that makes the object appear whole when the file is closed, or not
at all. There are no directories on a store: a "directory" exists when a
key lies under it, creating one is a no-op, and deleting one deletes the
keys under it.
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs

READ_BUFFER = 8 << 20
"""Bytes one ranged GET of a read fetches (a Parquet column chunk is read in a few)."""


class _Reader:
    """obstore's buffered reader with the attributes :class:`pyarrow.PythonFile` asks for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        return bytes(self._inner.read(None if size is None or size < 0 else size))

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self._inner.tell())

    def size(self) -> int:
        return int(self._inner.size)

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            self.closed = True


class _Writer:
    """obstore's buffered writer with the attributes :class:`pyarrow.PythonFile` asks for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        n = int(self._inner.write(data))
        self._written += n
        return n

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing to do: the upload completes at :meth:`close` (a flush would cut a multipart part short)."""

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            self.closed = True


class StoreHandler(pafs.FileSystemHandler):
    """``pyarrow.fs.FileSystemHandler`` over one bucket's obstore client (paths ``<bucket>/<key>``)."""

    def __init__(self, store: Any, bucket: str, type_name: str) -> None:
        self.store = store
        self.bucket = bucket
        self.type_name = type_name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreHandler) and other.store is self.store and other.bucket == self.bucket

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return f"pgpoll-{self.type_name}"

    def normalize_path(self, path: str) -> str:
        return path.strip("/")

    def _key(self, path: str) -> str:
        path = path.strip("/")
        if path == self.bucket:
            return ""
        if not path.startswith(self.bucket + "/"):
            raise FileNotFoundError(f"{path} is not in bucket {self.bucket}")
        return path[len(self.bucket) + 1:]

    def _info(self, path: str) -> pafs.FileInfo:
        import obstore
        from obstore.exceptions import NotFoundError  # (obstore raises FileNotFoundError for a 404)

        key = self._key(path)
        if key:
            try:
                meta = obstore.head(self.store, key)
                return pafs.FileInfo(path, pafs.FileType.File, size=int(meta["size"]), mtime=meta["last_modified"])
            except (FileNotFoundError, NotFoundError):
                pass
        listed = obstore.list_with_delimiter(self.store, key + "/" if key else None)
        if not key or listed["objects"] or listed["common_prefixes"]:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: str | list[str]) -> list[pafs.FileInfo]:
        return [self._info(p) for p in ([paths] if isinstance(paths, str) else paths)]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        import obstore

        base = selector.base_dir.strip("/")
        key = self._key(base)
        prefix = key + "/" if key else None
        out: list[pafs.FileInfo] = []
        if selector.recursive:
            seen: set[str] = set()
            for chunk in obstore.list(self.store, prefix):
                for meta in chunk:
                    rel = str(meta["path"])
                    out.append(pafs.FileInfo(f"{self.bucket}/{rel}", pafs.FileType.File, size=int(meta["size"]),
                                             mtime=meta["last_modified"]))
                    parts = rel[len(prefix or ""):].split("/")[:-1]
                    for i in range(1, len(parts) + 1):
                        seen.add("/".join(parts[:i]))
            out += [pafs.FileInfo(f"{base}/{d}", pafs.FileType.Directory) for d in sorted(seen)]
        else:
            listed = obstore.list_with_delimiter(self.store, prefix)
            out += [pafs.FileInfo(f"{self.bucket}/{p.rstrip('/')}", pafs.FileType.Directory)
                    for p in listed["common_prefixes"]]
            out += [pafs.FileInfo(f"{self.bucket}/{m['path']}", pafs.FileType.File, size=int(m["size"]),
                                  mtime=m["last_modified"]) for m in listed["objects"]]
        if not out and not selector.allow_not_found and key and self._info(base).type == pafs.FileType.NotFound:
            raise FileNotFoundError(base)
        return out

    def create_dir(self, path: str, recursive: bool) -> None:
        """Nothing to create: a store has no directories."""

    def delete_dir(self, path: str) -> None:
        self.delete_dir_contents(path, missing_dir_ok=True)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        import obstore

        key = self._key(path)
        keys = [str(m["path"]) for chunk in obstore.list(self.store, key + "/" if key else None) for m in chunk]
        if keys:
            obstore.delete(self.store, keys)

    def delete_root_dir_contents(self) -> None:
        self.delete_dir_contents(self.bucket)

    def delete_file(self, path: str) -> None:
        import obstore

        obstore.delete(self.store, self._key(path))

    def move(self, src: str, dest: str) -> None:
        import obstore

        obstore.rename(self.store, self._key(src), self._key(dest))

    def copy_file(self, src: str, dest: str) -> None:
        import obstore

        obstore.copy(self.store, self._key(src), self._key(dest))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        import obstore

        reader = obstore.open_reader(self.store, self._key(path), buffer_size=READ_BUFFER)
        return pa.PythonFile(cast(Any, _Reader(reader)), mode="r")

    def open_output_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.NativeFile:
        import obstore

        return pa.PythonFile(cast(Any, _Writer(obstore.open_writer(self.store, self._key(path)))), mode="w")

    def open_append_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.NativeFile:
        raise NotImplementedError("objects cannot be appended to")


def arrow_filesystem(store: Any, bucket: str, type_name: str) -> pafs.FileSystem:
    """A ``pyarrow.fs`` filesystem over ``store`` (paths ``<bucket>/<key>``)."""
    return pafs.PyFileSystem(StoreHandler(store, bucket, type_name))
