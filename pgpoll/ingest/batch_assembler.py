"""Committed transactions of one peek, as Arrow record batches, in bounded memory.

The ingest task's counterpart of :class:`pgpoll.decode.assembler.TransactionAssembler`,
specialised for what a batch peek can contain (whole transactions, no
streaming, no two-phase) and built for speed: changes go straight into
column lists (:class:`pgpoll.sink.envelope.ChangeColumns`) with no object per
change, and rows from a decoder's fast path arrive as the plugin-neutral
:data:`pgpoll.changes.RowFields` (split by :func:`pgpoll.changes.split_row`).

Rows of the open transaction wait for its COMMIT (only then is ``commit_lsn``
known). When a transaction outgrows ``rows_per_batch`` its rows so far are
written to a local Arrow IPC spill file and read back at commit, so a
transaction of any size passes through bounded memory. A transaction whose
commit is at or below ``high_water_mark`` is already in the output and is
dropped; so are pgpoll's heartbeat messages and tables the filter leaves out.

Transaction ids: the plugins print 32-bit ids; the envelope's ``xid`` holds
the full 64-bit id. The peek gives a full id read after it built its result
(:attr:`BatchAssembler.xid_reference`, see
:func:`pgpoll.source.slots.peek_rows`), and :meth:`BatchAssembler.commit`
widens the committed transaction's id with it (:func:`pgpoll.xids.widen_xid`)
— the one place ids are widened, for every path a row comes in by. The
lowest and highest full id of the transactions the batch covers (also those
that wrote no rows, such as pgpoll's heartbeat) go to the commit log.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from io import BufferedRandom
from typing import Any

import pyarrow as pa

from pgpoll.changes import HEARTBEAT_PREFIX, LogicalMessage, Op, RelationInfo, RowChange, RowFields, Truncate, split_row
from pgpoll.errors import SourceError
from pgpoll.sink.envelope import ENVELOPE_SCHEMA, ChangeColumns, Lsns, insert_rows_batch, with_transaction
from pgpoll.typed.schemas import CatalogTable, TableSchema, schema_from_columns, schema_from_relation
from pgpoll.xids import widen_xid

__all__ = ["HEARTBEAT_PREFIX", "BatchAssembler"]  # HEARTBEAT_PREFIX: re-exported from pgpoll.changes for now
_LETTER = {op: op.value for op in Op}  # a dict lookup is cheaper than Enum.value
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_HALF = 1 << 31


def _micros(ts: datetime | None) -> int | None:
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _MICROSECOND


class BatchAssembler:
    """Turns the events of one peek into record batches of committed changes."""

    def __init__(
        self,
        *,
        high_water_mark: int | None,
        accepts: Callable[[str | None, str | None], bool],
        rows_per_batch: int = 65536,
        type_names: Mapping[int, tuple[str, str]] | None = None,
        catalog: Callable[[str, str], CatalogTable | None] | None = None,
        row_filters: Any | None = None,
    ) -> None:
        self.hwm = high_water_mark
        self.type_names: Mapping[int, tuple[str, str]] = type_names if type_names is not None else {}
        self.catalog = catalog
        self.row_filters = row_filters  # pgpoll.rowfilter.evaluate.TableFilters (test_decoding --row-filter)
        self._catalog_cache: dict[tuple[str, str], CatalogTable | None] = {}
        #: fast-path relation (the object itself) -> schema id, or None when filtered out
        self._relation_schema: dict[RelationInfo, str | None] = {}
        self._row_schema: dict[tuple[Any, ...], str] = {}
        #: every table schema a written row refers to, by id
        self.schemas: dict[str, TableSchema] = {}
        self.accepts = accepts
        self.rows_per_batch = rows_per_batch
        self.cols = ChangeColumns()
        self._in_txn = False
        self._xid: int | None = None
        self._begin_ts: datetime | None = None
        self._spill: BufferedRandom | None = None
        self._spill_writer: pa.ipc.RecordBatchStreamWriter | None = None
        #: open-transaction batches not yet in the spill file (kept in memory up to ``rows_per_batch`` rows)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._spilled_rows = 0
        # what the driver learns
        self.changes = 0
        self.first_commit_lsn: int | None = None
        self.last_commit_lsn: int | None = None
        self.last_commit_ts: datetime | None = None
        self.first_commit_ts: datetime | None = None
        self.advance_to: int | None = None
        #: a full (64-bit) id not older than any committed transaction of the peek; None: ids stay as given
        self.xid_reference: int | None = None
        self.xid_min: int | None = None  # full ids of the transactions the batch covers
        self.xid_max: int | None = None

    def set_xid_reference(self, reference: int) -> None:
        """The full id the peek's 32-bit ids are widened against (:func:`pgpoll.source.slots.peek_rows`)."""
        self.xid_reference = reference

    def full_xid(self, xid: int | None) -> int | None:
        """The full 64-bit id of a committed transaction's 32-bit ``xid`` (unchanged without a reference).

        The full id nearest the reference: normally at or below it, but a
        transaction whose commit record is already flushed (so decoded) can
        still count as running when the reference is read — a commit waiting
        for a synchronous standby does so for as long as the standby takes —
        and then its id may be at or above ``xmax``. Every id the server still
        has in use is within 2^31 of its next id (wraparound protection), so
        the nearest full id is the right one either way.
        """
        if xid is None or self.xid_reference is None:
            return xid
        try:
            return widen_xid(xid, self.xid_reference)
        except ValueError:
            pass  # newer than the reference, or no such full id below it
        try:
            return widen_xid(xid, self.xid_reference + _HALF - 1)
        except ValueError as exc:
            raise SourceError(  # a PgpollError the task reports (no row is rejected: the row is not at fault)
                f"transaction id {xid} cannot be widened to a full 64-bit id: {exc}",
                "the peek's reference id (pg_current_snapshot's xmax) is read after the peek; run again, and "
                "report it if it persists",
            ) from None

    @property
    def in_transaction(self) -> bool:
        """True between a BEGIN and its COMMIT."""
        return self._in_txn

    # ---- transaction framing ---------------------------------------------------------

    def begin(self, xid: int | None, commit_ts: datetime | None) -> None:
        """A transaction starts (pgoutput's Begin already carries the commit time)."""
        self._in_txn = True
        self._xid = xid
        self._begin_ts = commit_ts

    def commit(self, lsn: int, xid: int | None, commit_ts: datetime | None) -> Iterator[pa.RecordBatch]:
        """The open transaction committed; ``lsn`` is the COMMIT row's (the commit record's end).

        ``xid`` (and the BEGIN's) is the 32-bit id the plugin printed; the
        rows get its full id (:meth:`full_xid`).
        """
        self.advance_to = lsn
        xid = self.full_xid(self._xid if self._xid is not None else xid)
        commit_ts = commit_ts if commit_ts is not None else self._begin_ts
        ts = _micros(commit_ts)
        self._in_txn = False
        covered = self.hwm is None or lsn > self.hwm
        if covered and xid is not None:
            self.xid_min = xid if self.xid_min is None else min(self.xid_min, xid)
            self.xid_max = xid if self.xid_max is None else max(self.xid_max, xid)
        rows = self._spilled_rows + len(self.cols) - self.cols.filled
        if rows == 0 or not covered:
            self.cols.drop_unfilled()
            self._close_spill()
            return
        self.first_commit_lsn = lsn if self.first_commit_lsn is None else min(self.first_commit_lsn, lsn)
        self.last_commit_lsn = lsn if self.last_commit_lsn is None else max(self.last_commit_lsn, lsn)
        self.last_commit_ts = commit_ts
        self.first_commit_ts = self.first_commit_ts or commit_ts
        self.changes += rows
        if self._spilled_rows:
            yield from self._read_spill(lsn, xid, ts)
        self.cols.fill_transaction(lsn, xid, ts, self._spilled_rows)
        self._spilled_rows = 0
        yield from self._flush_if_full()

    def message(self, event: LogicalMessage, lsn: int) -> Iterator[pa.RecordBatch]:
        """A logical message: part of the transaction, or (non-transactional) a change of its own."""
        if event.prefix == HEARTBEAT_PREFIX:
            if not event.transactional:
                self.advance_to = lsn
            return
        if event.transactional:
            self.cols.add_message(lsn, event.prefix, event.content, True)
            yield from self._flush_if_full()
            return
        self.advance_to = lsn
        if self.hwm is not None and lsn <= self.hwm:
            return
        open_rows = len(self.cols) - self.cols.filled
        if open_rows:  # keep the open transaction's rows last: set the message apart first
            yield from self._flush_committed()
            self._spill_open_rows()
        self.cols.add_message(lsn, event.prefix, event.content, False)
        self.cols.fill_transaction(lsn, None, None, 0)
        self.changes += 1
        # its commit_lsn is its own lsn: the batch's range must hold it too
        self.first_commit_lsn = lsn if self.first_commit_lsn is None else min(self.first_commit_lsn, lsn)
        self.last_commit_lsn = lsn if self.last_commit_lsn is None else max(self.last_commit_lsn, lsn)
        yield from self._flush_if_full()

    # ---- changes ----------------------------------------------------------------------

    def _relation_schema_id(self, rel: RelationInfo) -> str | None:
        """The schema id of a fast-path relation (cached by the relation object), ``None`` when filtered out."""
        try:
            return self._relation_schema[rel]
        except KeyError:
            sid = self._relation_schema[rel] = self._schema_of_relation(rel)
            return sid

    def row_fields(self, row: RowFields, lsn: int) -> Iterator[pa.RecordBatch]:
        """An INSERT/UPDATE/DELETE from a decoder's fast path."""
        rel = row[1]
        sid = self._relation_schema_id(rel)
        if sid is None:
            return
        before_names, before_values, after_names, after_values, toast = split_row(row)
        self.cols.add_row(
            lsn, _LETTER[row[0]], rel.schema, rel.table, before_names, before_values, after_names, after_values, toast,
            sid,
        )
        if len(self.cols) >= self.rows_per_batch:
            yield from self._flush_if_full()

    def insert_block(self, rel: RelationInfo, lsns: Lsns, after: pa.MapArray[Any, Any]) -> Iterator[pa.RecordBatch]:
        """INSERTs of one relation decoded column-wise (:mod:`pgpoll.decode.pgoutput_columns`), in peek order.

        The same rows :meth:`row_fields` would add one by one; they join the
        open transaction after its rows so far (which are set apart first, so
        the order within the transaction, hence ``seq``, is the peek's).
        """
        sid = self._relation_schema_id(rel)
        if sid is not None:
            yield from self._add_open_block(insert_rows_batch(lsns, rel.schema, rel.table, after, sid))

    def _add_open_block(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Rows of the open transaction built as a whole batch: after its rows so far, in order."""
        yield from self._flush_committed()
        self._spill_open_rows()
        self._write_spill(batch)

    def takes_rows_like(self, event: RowChange) -> bool:
        """True when INSERTs shaped like ``event`` may come column-wise (:meth:`insert_rows_like`).

        Not where a client-side row filter applies: it looks at every row.
        """
        return self.row_filters is None or not self.row_filters.applies_to(event.schema, event.table)

    def insert_rows_like(self, event: RowChange, lsns: Lsns, after: pa.MapArray[Any, Any]) -> Iterator[pa.RecordBatch]:
        """test_decoding INSERTs with the table, columns and types of ``event``, decoded column-wise.

        The rows :meth:`row_change` would add one by one for the same lines
        (:mod:`pgpoll.decode.text_columns`), in peek order.
        """
        if not self.accepts(event.schema, event.table):
            return
        yield from self._add_open_block(insert_rows_batch(lsns, event.schema, event.table, after, self._schema_of(event)))

    def _schema_of_relation(self, rel: RelationInfo) -> str | None:
        """The schema id of a fast-path relation, or ``None`` when the table filter leaves it out."""
        if not self.accepts(rel.schema, rel.table):
            return None
        described = schema_from_relation(rel, self.type_names)
        self.schemas[described.schema_id] = described
        return described.schema_id

    def row_change(self, event: RowChange, lsn: int) -> Iterator[pa.RecordBatch]:
        """An INSERT/UPDATE/DELETE event (test_decoding, or pgoutput's slow path)."""
        if not self.accepts(event.schema, event.table):
            return
        letter, before, after = _LETTER[event.op], event.before, event.after
        toast = list(event.unchanged_toast)
        if self.row_filters is not None and self.row_filters.applies_to(event.schema, event.table):
            types = {c.name: c.type_name or "text" for c in event.columns}
            kept = self.row_filters.transform(letter, event.schema, event.table, before, after, types)
            if kept is None:
                return  # the filter leaves this change out, as a publication's row filter would
            letter, before, after = kept
            toast = [n for n in toast if after is None or n not in after]
        self.cols.add_row(
            lsn, letter, event.schema, event.table,
            None if before is None else list(before.keys()), () if before is None else list(before.values()),
            None if after is None else list(after.keys()), () if after is None else list(after.values()),
            toast, self._schema_of(event),
        )
        yield from self._flush_if_full()

    def _schema_of(self, event: RowChange) -> str:
        """The schema id of a test_decoding row (columns and types from the line, identity from the catalog)."""
        partial = event.op is Op.DELETE
        shape = (event.schema, event.table, partial, tuple((c.name, c.type_name) for c in event.columns))
        sid = self._row_schema.get(shape)
        if sid is not None:
            return sid
        if partial:  # a DELETE shows only the old key: use a full shape of this batch that agrees with it
            for known in self.schemas.values():
                if (known.schema, known.table) == (event.schema, event.table) and not known.partial and all(
                    known.column(col.name) is not None for col in event.columns
                ):
                    self._row_schema[shape] = known.schema_id
                    return known.schema_id
        where = (event.schema, event.table)
        if where not in self._catalog_cache:
            self._catalog_cache[where] = self.catalog(*where) if self.catalog is not None else None
        described = schema_from_columns(
            event.schema, event.table, [(c.name, c.type_name) for c in event.columns], self._catalog_cache[where],
            partial=partial,
        )
        self.schemas[described.schema_id] = described
        self._row_schema[shape] = described.schema_id
        return described.schema_id

    def truncate(self, event: Truncate, lsn: int) -> Iterator[pa.RecordBatch]:
        """A TRUNCATE: one row per table."""
        for schema, table in event.relations:
            if self.accepts(schema, table):
                self.cols.add_row(lsn, "T", schema, table, None, (), None, ())
        yield from self._flush_if_full()

    def finish(self) -> Iterator[pa.RecordBatch]:
        """End of the peek: the committed rest; an unfinished transaction is dropped."""
        self.cols.drop_unfilled()
        self._close_spill()
        yield from self._flush_committed()

    # ---- batching and spilling ---------------------------------------------------------

    def _flush_if_full(self) -> Iterator[pa.RecordBatch]:
        if len(self.cols) < self.rows_per_batch:
            return
        yield from self._flush_committed()
        if len(self.cols) >= self.rows_per_batch:
            self._spill_open_rows()

    def _flush_committed(self) -> Iterator[pa.RecordBatch]:
        """Yield the rows whose transaction committed; keep the open transaction's rows."""
        filled = self.cols.filled
        if not filled:
            return
        batch = self.cols.to_batch(0, filled)
        open_part = self.cols.to_batch(filled, unfilled=True) if len(self.cols) > filled else None
        self.cols.clear()
        if open_part is not None:
            self._write_spill(open_part)
        yield batch

    def _spill_open_rows(self) -> None:
        if len(self.cols) > self.cols.filled:
            self._write_spill(self.cols.to_batch(self.cols.filled, unfilled=True))
            self.cols.drop_unfilled()

    def _write_spill(self, batch: pa.RecordBatch) -> None:
        """Set rows of the open transaction apart: in memory up to ``rows_per_batch`` rows, then in the spill file."""
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._spilled_rows += batch.num_rows
        if self._pending_rows <= self.rows_per_batch:
            return
        if self._spill_writer is None:
            self._spill = tempfile.TemporaryFile(prefix="pgpoll-txn-")  # noqa: SIM115 -- open across calls, closed in _close_spill
            self._spill_writer = pa.ipc.new_stream(self._spill, ENVELOPE_SCHEMA)
        for pending in self._pending:
            self._spill_writer.write_batch(pending)
        self._pending.clear()
        self._pending_rows = 0

    def _read_spill(self, lsn: int, xid: int | None, ts: int | None) -> Iterator[pa.RecordBatch]:
        seq = 0
        if self._spill is not None and self._spill_writer is not None:
            self._spill_writer.close()
            self._spill.seek(0)
            for batch in pa.ipc.open_stream(self._spill):
                yield with_transaction(batch, lsn, xid, ts, seq)
                seq += batch.num_rows
        for batch in self._pending:
            yield with_transaction(batch, lsn, xid, ts, seq)
            seq += batch.num_rows
        self._close_spill(keep_count=True)

    def _close_spill(self, keep_count: bool = False) -> None:
        if self._spill is not None:
            self._spill.close()
        self._spill = None
        self._spill_writer = None
        self._pending = []
        self._pending_rows = 0
        if not keep_count:
            self._spilled_rows = 0
