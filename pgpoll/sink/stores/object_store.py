"""The output filesystem on an object store (S3, GCS, Azure Blob), through pgpoll's own client: no JVM, no Hadoop.

Paths are URIs under the output root (``s3://lake/pg/orders/_pgpoll/...``);
each maps to one key of the bucket (:class:`pgpoll.sink.stores.config.StoreLocation`).
What a store gives and what pgpoll builds on it:

* :meth:`ObjectStoreOutputFs.create_exclusive` is a conditional create
  (``If-None-Match: *``; obstore's ``mode="create"``): of racing writers
  exactly one succeeds, the others get 412/409, and the object appears
  whole. So the commit log is fenced (``fenced`` is True).
* :meth:`ObjectStoreOutputFs.swap` is a conditional replace on the ETag
  (``If-Match``; on GCS the generation): the lease's compare-and-swap.
* A request the client retried after a lost response can find its own
  earlier attempt already applied (a create then sees "exists", a swap
  "precondition failed"). Every body pgpoll creates this way is unique to
  its writer (run ids, staging ids, timestamps), so a loser's answer is
  checked against what the store holds: the same bytes mean this call won.
* There are no directories and no rename: ``mkdirs`` does nothing,
  ``delete`` of a "directory" deletes the keys under it, ``rename`` is a copy
  and a delete (never used to publish: data files are written once at their
  final key, ``direct_writes`` is True).

Errors become one :class:`~pgpoll.errors.SinkError` line naming the store,
the path and the setting to fix (:func:`store_error`); request URLs lose
their query strings (an Azure SAS token travels there).
"""

from __future__ import annotations

import builtins
import logging
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pgpoll.errors import SinkError
from pgpoll.sink.stores.config import CREDENTIAL_HINT, ENDPOINT_HINT, StoreLocation

if TYPE_CHECKING:
    import pyarrow.fs as pafs

T = TypeVar("T")
log = logging.getLogger("pgpoll.sink")
ONE_PUT = 64 << 20
"""Files up to this size are uploaded with one PUT of their bytes; larger ones in parts of :data:`PART_SIZE`."""
PART_SIZE = 16 << 20
ATTEMPTS = 6
"""Attempts of one operation on a patient client (the client retries each request a few times itself first)."""
_THROTTLED = re.compile(r"\b(500|502|503|504|429)\b|SlowDown|Throttl|InternalError|ServiceUnavailable", re.IGNORECASE)
_NETWORK = re.compile(r"RequestTimeout|timed out|error sending request|connection (reset|closed)|broken pipe", re.IGNORECASE)
_QUERY = re.compile(r"\?[^\s\"']*")
_URL = re.compile(r"https?://[^\s\"']+")


def _clean(text: str) -> str:
    """The first line of an obstore error, without query strings (SAS tokens) and with URLs shortened."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = _QUERY.sub("", line)
    return line[:400]


def _is_file_name(key: str) -> bool:
    """Whether ``key`` names one of pgpoll's files (they all end so; its directories never do)."""
    return key.endswith((".json", ".parquet"))


def transient(exc: BaseException, network: bool = True) -> bool:
    """Whether a failed request is worth repeating: throttling and server errors, and (``network``) timeouts and
    broken connections. Credentials, missing buckets and refused preconditions are not."""
    text = str(exc)
    return bool(_THROTTLED.search(text) or (network and _NETWORK.search(text)))


def retrying(what: str, fn: Callable[[], T], *, store: str = "the store", patient: bool = True) -> T:
    """``fn()``, repeated with exponential backoff while it fails transiently (:func:`transient`), each retry logged.

    For pgpoll's own requests (:meth:`ObjectStoreOutputFs._call`) and delta-rs's (the change log's Delta table).
    """
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == ATTEMPTS or not transient(exc, network=patient):
                raise
            wait = min(30.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            log.warning("%s: cannot %s (%s); retrying in %.1f s (attempt %d of %d)", store, what,
                        _clean(str(exc))[:160], wait, attempt + 1, ATTEMPTS)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def store_error(location: StoreLocation, what: str, path: str, exc: BaseException) -> SinkError:
    """The :class:`SinkError` for a failed request, with the fix that fits its cause."""
    from obstore import exceptions as oe

    text = str(exc)
    where = f"{location.name} ({location.endpoint() or 'default endpoint'})"
    if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or " 403 " in text or "403 Forbidden" in text:
        return SinkError(f"cannot {what} {path}: {where} refused the credentials",
                         f"check {CREDENTIAL_HINT[location.kind]} for bucket {location.bucket!r}")
    if "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text.lower():
        return SinkError(f"cannot {what} {path}: bucket {location.bucket!r} does not exist on {where}",
                         f"create the bucket, or fix the bucket in the output URI ({location.url()})")
    if "error sending request" in text or ("connect" in text.lower() and "timed out" in text.lower()):
        return SinkError(f"cannot {what} {path}: {where} is unreachable",
                         f"check that the store is up and that {ENDPOINT_HINT[location.kind]} points at it")
    return SinkError(f"cannot {what} {path}: {_clean(text)}", "check that the output's store is reachable and writable")


class ObjectStoreOutputFs:
    """An output on S3, GCS or Azure Blob Storage (see the module docstring); pickles, without its client."""

    fenced = True
    atomic_dir_rename = False
    direct_writes = True

    def __init__(self, output: str, location: StoreLocation | None = None) -> None:
        self.location = location or StoreLocation.parse(output)
        self.scheme = self.location.kind
        self.root = self.location.url()

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__("", state["location"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ObjectStoreOutputFs({self.root!r})"

    def quick(self) -> ObjectStoreOutputFs:
        """The same output through a client that gives up within seconds (start-up checks)."""
        return ObjectStoreOutputFs(self.root, self.location.quick())

    @property
    def store(self) -> Any:
        """The obstore client (one per process and location)."""
        return self.location.store()

    def path(self, *parts: str) -> str:
        """``root/part/part``."""
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def key(self, path: str) -> str:
        """The bucket key of ``path``."""
        rel = self.location.key(path)
        return "/".join(p for p in (self.location.prefix, rel) if p)

    def _call(self, what: str, path: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff (and logged) while the store throttles or the network fails.

        Every operation here is safe to repeat: reads, listings, deletes and
        overwrites are idempotent, and a conditional write whose first attempt
        did land recognises its own bytes (see the module docstring).
        """
        try:  # a start-up check (not patient) waits out throttling only: an unreachable store fails at once
            return retrying(f"{what} {path}", fn, store=self.location.name, patient=self.location.patient)
        except SinkError:
            raise
        except Exception as exc:
            raise store_error(self.location, what, path, exc) from None

    def _head(self, key: str) -> dict[str, Any] | None:
        import obstore
        from obstore.exceptions import NotFoundError  # (obstore raises FileNotFoundError for a 404)

        try:
            return dict(obstore.head(self.store, key))
        except (FileNotFoundError, NotFoundError):
            return None

    def exists(self, path: str) -> bool:
        """True when an object is at ``path`` or any key lies under it.

        A name ending in ``.json`` or ``.parquet`` is one of pgpoll's files,
        never a directory: one HEAD answers (no listing).
        """
        import obstore

        key = self.key(path)

        def check() -> bool:
            if key and self._head(key) is not None:
                return True
            if _is_file_name(key):
                return False
            # any key below (a recursive listing: SeaweedFS keeps empty "directories" as common prefixes)
            first = next(iter(obstore.list(self.store, key + "/" if key else None, chunk_size=1)), None)
            return bool(first)

        return self._call("check", path, check)

    def mkdirs(self, path: str) -> None:
        """Nothing to do: a store has no directories."""

    def _keys_under(self, key: str) -> builtins.list[str]:
        import obstore

        return [str(m["path"]) for chunk in obstore.list(self.store, key + "/" if key else None) for m in chunk]

    def _delete_keys(self, keys: builtins.list[str]) -> None:
        import obstore
        from obstore.exceptions import NotFoundError  # (obstore raises FileNotFoundError for a 404)

        for start in range(0, len(keys), 1000):
            try:
                obstore.delete(self.store, keys[start:start + 1000])
            except (FileNotFoundError, NotFoundError):  # (Azure answers 404 for a key that is gone)
                for key in keys[start:start + 1000]:
                    try:
                        obstore.delete(self.store, key)
                    except (FileNotFoundError, NotFoundError):
                        continue

    def delete(self, path: str) -> None:
        """Delete the object at ``path`` and every key under it (no error when there is none); one of pgpoll's
        files (a name ending in ``.json`` or ``.parquet``) with one request."""
        key = self.key(path)

        def remove() -> None:
            if _is_file_name(key):
                self._delete_keys([key])
                return
            keys = self._keys_under(key)
            if key and self._head(key) is not None:
                keys.append(key)
            self._delete_keys(keys)

        self._call("delete", path, remove)

    def delete_files(self, paths: builtins.list[str]) -> None:
        """Delete these objects (one request per thousand; absent ones are not an error)."""
        self._call("delete", self.root, lambda: self._delete_keys([self.key(p) for p in paths]))

    def rename(self, src: str, dst: str) -> None:
        """Copy ``src`` (an object or every key under it) to ``dst``, then delete it: not atomic."""
        import obstore

        if self.exists(dst):
            raise SinkError(f"cannot rename {src} to {dst}: the target exists", "check the output for leftovers")
        skey, dkey = self.key(src), self.key(dst)

        def move() -> None:
            single = self._head(skey)
            pairs = [(skey, dkey)] if single is not None else [(k, dkey + k[len(skey):]) for k in self._keys_under(skey)]
            if not pairs:
                raise SinkError(f"cannot rename {src}: it does not exist", "check the output for leftovers")
            for old, new in pairs:
                obstore.copy(self.store, old, new)
            self._delete_keys([old for old, _new in pairs])

        self._call("rename", src, move)

    def list(self, path: str) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of the keys and key prefixes directly under ``path``."""
        import obstore

        key = self.key(path)

        def scan() -> list[tuple[str, bool, int]]:
            prefix = key + "/" if key else ""
            listed = obstore.list_with_delimiter(self.store, prefix or None)
            return [(str(p).rstrip("/").rsplit("/", 1)[-1], True, 0) for p in listed["common_prefixes"]] + [
                (str(m["path"])[len(prefix):], False, int(m["size"])) for m in listed["objects"]
                if str(m["path"]).startswith(prefix) and len(str(m["path"])) > len(prefix)]  # (no directory markers)

        return self._call("list", path, scan)

    def list_files(self, path: str) -> builtins.list[tuple[str, int]]:
        """``(path relative to ``path``, size)`` of every object under ``path``, at any depth."""
        import obstore

        key = self.key(path)

        def scan() -> builtins.list[tuple[str, int]]:
            base = len(key) + 1 if key else 0
            return [(str(m["path"])[base:], int(m["size"]))
                    for chunk in obstore.list(self.store, key + "/" if key else None) for m in chunk]

        return self._call("list", path, scan)

    def read_bytes(self, path: str) -> bytes:
        """The whole content of an object (SinkError when absent)."""
        import obstore

        return self._call("read", path, lambda: bytes(obstore.get(self.store, self.key(path)).bytes()))

    def read_text(self, path: str) -> str:
        """The whole content of a small UTF-8 object."""
        return self.read_bytes(path).decode("utf-8")

    def write_text(self, path: str, text: str) -> None:
        """Write (or replace) a small object: one PUT, so readers see the old content or the new."""
        import obstore

        self._call("write", path, lambda: obstore.put(self.store, self.key(path), text.encode("utf-8")))

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether the object at ``key`` holds exactly ``data`` (a retried request's own earlier attempt)."""
        import obstore
        from obstore.exceptions import NotFoundError  # (obstore raises FileNotFoundError for a 404)

        try:
            return bytes(obstore.get(self.store, key).bytes()) == data
        except (FileNotFoundError, NotFoundError):
            return False

    def create_exclusive(self, path: str, text: str) -> bool:
        """A conditional create (``If-None-Match: *``): True when this call created the object."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        key, data = self.key(path), text.encode("utf-8")

        def create() -> bool:
            try:
                obstore.put(self.store, key, data, mode="create")
                return True
            except (AlreadyExistsError, PreconditionError):
                return self._holds(key, data)

        return self._call("create", path, create)

    def read_tagged(self, path: str) -> tuple[str, str] | None:
        """``(content, tag)``: the tag is the object's ETag (and its version where the store has one)."""
        import obstore
        from obstore.exceptions import NotFoundError  # (obstore raises FileNotFoundError for a 404)

        def read() -> tuple[str, str] | None:
            try:
                got = obstore.get(self.store, self.key(path))
            except (FileNotFoundError, NotFoundError):
                return None
            meta = got.meta
            return bytes(got.bytes()).decode("utf-8"), f"{meta.get('e_tag') or ''}|{meta.get('version') or ''}"

        return self._call("read", path, read)

    def swap(self, path: str, text: str, tag: str) -> bool:
        """A conditional replace (``If-Match`` on the ETag; the generation on GCS): True when it replaced."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        e_tag, _sep, version = tag.partition("|")
        condition: dict[str, str] = {"e_tag": e_tag}
        if version:
            condition["version"] = version
        key, data = self.key(path), text.encode("utf-8")

        def replace() -> bool:
            try:
                obstore.put(self.store, key, data, mode=condition)  # type: ignore[arg-type]
                return True
            except (PreconditionError, AlreadyExistsError, FileNotFoundError, NotFoundError):
                return self._holds(key, data)

        return self._call("replace", path, replace)

    def arrow(self) -> pafs.FileSystem:
        """A ``pyarrow.fs`` filesystem over this store's client (paths ``<bucket>/<key>``)."""
        from pgpoll.sink.stores.arrow_store import arrow_filesystem

        return arrow_filesystem(self.store, self.location.bucket, self.location.kind)

    def arrow_path(self, path: str) -> str:
        """``<bucket>/<key>``."""
        return f"{self.location.bucket}/{self.key(path)}"

    def put_file(self, local: str, path: str) -> int:
        """Upload a local file to ``path``; it appears whole or not at all, and its size is checked afterwards.

        A file up to :data:`ONE_PUT` bytes goes up as one PUT of its bytes in
        memory, a larger one in parts (a buffered multipart upload). Not as a
        streamed body: a PUT retried after a throttling answer cannot rewind a
        stream, and was seen storing an empty object.
        """
        import obstore

        size = Path(local).stat().st_size
        key = self.key(path)

        def upload() -> None:
            if size <= ONE_PUT:
                obstore.put(self.store, key, Path(local).read_bytes())
            else:
                with open(local, "rb") as source, obstore.open_writer(self.store, key, buffer_size=PART_SIZE) as sink:
                    while chunk := source.read(PART_SIZE):
                        sink.write(chunk)
            stored = self._head(key)
            if stored is None or int(stored["size"]) != size:  # (retried: the store answered 503-like)
                raise OSError(f"503 upload of {key} stored {None if stored is None else stored['size']} of {size} bytes")

        self._call("write", path, upload)
        return size
