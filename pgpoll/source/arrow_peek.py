"""Peek a slot straight into Arrow through ADBC: the ingest task's fast fetch.

Why: psycopg2 receives ``bytea`` as hex text and builds a Python object per
value; for a backlog of a million changes that is seconds on top of the
server's own decode. adbc-driver-postgresql runs the peek as
``COPY (query) TO STDOUT (FORMAT binary)`` and parses the stream in C++ into
Arrow record batches (about 4 MB each, :data:`BATCH_BYTES`: memory stays
bounded): the ``data`` column arrives as one contiguous buffer with
offsets, which is what :class:`pgpoll.decode.pgoutput_columns.PeekChunk`
reads without a copy per row.

Same transaction rules as :func:`pgpoll.source.slots.peek_chunks`: one
transaction, the session settings pinned inside it with ``set_config(...,
true)`` (:mod:`pgpoll.source.session`), read-only, rolled back at the end;
nothing session-level, so a transaction pooler is fine (COPY has no
parameters, so the peek's arguments are quoted literals, not bound: no
prepared statement either). Never consumes.

Both plugins: pgoutput's ``bytea`` and test_decoding's ``text`` arrive as
one buffer with offsets, and the task reads either as bytes (so a
test_decoding line that is not UTF-8 still reaches the reject file as it
came). ``PGPOLL_FETCH`` chooses: ``auto`` (ADBC where installed), ``adbc``
(refuse to run without it), ``psycopg2``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import psycopg2.extensions
import pyarrow as pa

from pgpoll.decode.arrow_buffers import value_bytes, value_offsets
from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.source.connection import ConnectionTarget, connect_kwargs, redact
from pgpoll.source.names import sql_literal
from pgpoll.source.server_errors import translate
from pgpoll.source.session import pin_settings_sql
from pgpoll.source.slots import BINARY_PLUGINS
from pgpoll.source.waits import CallWatch

__all__ = [
    "ADBC", "BATCH_BYTES", "FETCH_ENV", "PSYCOPG2", "FetchUnavailableError", "choose_fetch", "peek_arrow", "requested_fetch",
    "set_batch_bytes",
]

FETCH_ENV = "PGPOLL_FETCH"
ADBC = "adbc"
PSYCOPG2 = "psycopg2"
_CHOICES = ("auto", ADBC, PSYCOPG2)


def _adbc_installed() -> bool:
    try:
        import adbc_driver_postgresql.dbapi  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


def requested_fetch() -> str:
    """``PGPOLL_FETCH`` checked: ``auto`` (unset), ``adbc`` or ``psycopg2``; :class:`ConfigError` otherwise."""
    raw = os.environ.get(FETCH_ENV, "").strip().lower() or "auto"
    if raw not in _CHOICES:
        raise ConfigError(f"{FETCH_ENV}={raw!r} is not one of {', '.join(_CHOICES)}",
                          f"set {FETCH_ENV} to auto (default), adbc or psycopg2")
    return raw


def choose_fetch(plugin: str, requested: str) -> str:
    """``"adbc"`` or ``"psycopg2"`` for a peek of ``plugin``, as ``requested`` (see :func:`requested_fetch`).

    ``auto`` takes ADBC where it is installed (checked where the
    peek runs: an executor may lack it), else psycopg2. Raises
    :class:`ConfigError` for ``adbc`` where it cannot be used.
    """
    usable = _adbc_installed()
    if requested == ADBC and not usable:
        raise ConfigError(f"{FETCH_ENV}=adbc, but adbc-driver-postgresql is not installed",
                          f"pip install adbc-driver-postgresql, or unset {FETCH_ENV} (or set it to psycopg2)")
    return ADBC if requested != PSYCOPG2 and usable else PSYCOPG2


class FetchUnavailableError(Exception):
    """The ADBC peek failed before its first row: read it with psycopg2 instead.

    Errors the server raises while building the peek (no such slot, slot in
    use, invalidated, missing publication) arrive from ADBC's COPY stream
    without their SQLSTATE; psycopg2 gets the same error with it, and
    :func:`pgpoll.source.server_errors.translate` needs it. A peek that fails
    here changed nothing, so reading it again is safe; and an ADBC that
    cannot connect where psycopg2 can costs speed, not the run.
    """


class _ServerError(Exception):
    """An ADBC error as :func:`pgpoll.source.server_errors.translate` reads errors (``pgcode``, ``pgerror``)."""

    def __init__(self, text: str) -> None:
        line = text.split("ERROR:", 1)[1].strip() if "ERROR:" in text else text
        super().__init__(line)
        self.pgcode: str | None = None  # the stream's errors carry none
        self.pgerror = line.splitlines()[0].rstrip(". ") if line else text


def _peek_query(plugin: str, slot: str, upto_lsn: Lsn | None, upto_nchanges: int | None, options: list[str]) -> str:
    """The peek with its columns as the server returns them: no expression per row (see :func:`_as_int64`)."""
    func = "pg_logical_slot_peek_binary_changes" if plugin in BINARY_PLUGINS else "pg_logical_slot_peek_changes"
    args = [sql_literal(slot) + "::name", "NULL::pg_lsn" if upto_lsn is None else sql_literal(str(upto_lsn)) + "::pg_lsn",
            "NULL::int" if upto_nchanges is None else f"{int(upto_nchanges)}::int", *map(sql_literal, options)]
    return f"SELECT lsn, xid, data FROM {func}({', '.join(args)})"


#: Bytes of COPY data per record batch ADBC hands over (the driver's default is 16 MB). A reader holds about
#: three (one read ahead, one worked on, one being written), so its memory does not follow the result's size;
#: and its work starts with the first batch and, after the last, has only that one left, so smaller batches
#: leave less of it outside the time the rows stream in (more batches cost a little each).
BATCH_BYTES = 4 << 20


def set_batch_bytes(cursor: Any) -> None:
    """Make an ADBC cursor's next result arrive in record batches of about :data:`BATCH_BYTES`."""
    cursor.adbc_statement.set_options(**{"adbc.postgresql.batch_size_hint_bytes": str(BATCH_BYTES)})


#: The binary wire form of the peek's ``lsn`` (pg_lsn_send: a big-endian int64) and ``xid`` (xidsend: uint32).
_WIRE_INTEGERS = {"lsn": ">i8", "xid": ">u4"}


def _as_int64(column: pa.Array[Any], name: str) -> pa.Array[Any]:
    """The peek's ``lsn`` or ``xid`` column as int64, read from its binary wire form.

    Why: asking the server for numbers instead (``(lsn - '0/0')::bigint``,
    ``xid::text::bigint``) goes through ``numeric`` and text for every row,
    which made the server's side of a million-row peek about 0.35 s slower
    here, a third of its decode (``COPY`` 1.71-1.76 s against 1.39 s with
    the columns as they are; ``count(*)`` of the peek 1.08-1.17 s).
    adbc-driver-postgresql has no Arrow type for ``pg_lsn`` and ``xid`` and
    hands over their binary form as opaque values: fixed-width big-endian
    integers, read here in one NumPy pass. Neither column is ever null (``LogicalOutputWrite`` in
    logicalfuncs.c fills both). A column that already arrives as integers
    (a driver that maps the types) is cast.
    """
    if pa.types.is_integer(column.type):
        return column.cast(pa.int64())
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    dtype = np.dtype(_WIRE_INTEGERS[name])
    if not pa.types.is_binary(storage.type) or storage.null_count:
        raise pa.ArrowInvalid(f"the peek's {name} column arrived as {column.type} (nulls: {storage.null_count})")
    n = len(storage)
    if not n:
        return pa.array([], pa.int64())
    offsets = value_offsets(storage)
    if not (np.diff(offsets) == dtype.itemsize).all():
        raise pa.ArrowInvalid(f"the peek's {name} column has values that are not {dtype.itemsize} bytes wide")
    return pa.array(np.frombuffer(value_bytes(storage), dtype, n, int(offsets[0])).astype(np.int64))


def _with_int64_ids(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with ``lsn`` and ``xid`` as int64 (see :func:`_as_int64`)."""
    return pa.RecordBatch.from_arrays(
        [_as_int64(batch.column(0), "lsn"), _as_int64(batch.column(1), "xid"), batch.column(2)],
        names=["lsn", "xid", "data"],
    )


def peek_arrow(
    target: ConnectionTarget,
    slot: str,
    plugin: str,
    *,
    upto_lsn: Lsn | None = None,
    upto_nchanges: int | None,
    options: list[str],
    application_name: str,
    on_first_batch: Callable[[], None] | None = None,
    watch: CallWatch | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """The peek's rows as record batches ``lsn int64, xid int64, data`` (``binary`` for pgoutput, else ``string``).

    Raises :class:`FetchUnavailableError` for a failure before the first batch,
    a translated :class:`~pgpoll.errors.PgpollError` for one after it.

    ``upto_lsn`` stops the decoding after the WAL record that ends there (as
    :func:`pgpoll.source.slots.peek_chunks`). ``on_first_batch`` is called
    once the server has built the peek's whole result (the first batch
    arrived), before it is yielded: the ingest task reads its transaction-id
    reference then (on its other connection). ``watch`` watches the server's
    decoding until the first batch (:mod:`pgpoll.source.waits`): the
    peek's backend pid is read in its transaction first, and a peek the
    watch cancelled raises the watch's error, not :class:`FetchUnavailableError`
    (psycopg2 would only wait again).
    """
    import adbc_driver_postgresql.dbapi as adbc

    password = tuple(p for p in [target.password()] if p)
    dsn = psycopg2.extensions.make_dsn(target.dsn, **connect_kwargs(target, application_name))
    try:
        conn = adbc.connect(dsn, autocommit=False)
    except adbc.Error as exc:
        raise FetchUnavailableError(redact(str(exc), password)) from None
    first = True
    try:
        cur = conn.cursor()
        set_batch_bytes(cur)
        cur.execute(pin_settings_sql(readonly=True))
        cur.fetchall()
        if watch is not None:  # the pid in the peek's own transaction, before it (see pgpoll.source.waits)
            cur.execute("SELECT pg_backend_pid()")
            watch.start(int(cur.fetchall()[0][0]))
        cur.execute(_peek_query(plugin, slot, upto_lsn, upto_nchanges, options))
        reader: Any = cur.fetch_record_batch()
        for batch in reader:
            converted = _with_int64_ids(batch)  # a form it cannot read fails before the first row: psycopg2 reads it
            if first:
                _stop(watch)
                if on_first_batch is not None:
                    on_first_batch()
            first = False
            yield converted
        if first:
            _stop(watch)
            if on_first_batch is not None:
                on_first_batch()
    except (adbc.Error, OSError, pa.ArrowException) as exc:  # the stream raises Arrow errors, with no SQLSTATE
        _stop(watch)
        if watch is not None and watch.verdict is not None:
            raise watch.verdict from None
        if first:
            raise FetchUnavailableError(redact(str(exc), password)) from None
        raise translate(_ServerError(redact(str(exc), password)), slot=slot) from None
    finally:
        _stop(watch)
        with contextlib.suppress(Exception):
            conn.rollback()
        with contextlib.suppress(Exception):
            conn.close()


def _stop(watch: CallWatch | None) -> None:
    if watch is not None:
        watch.stop()
