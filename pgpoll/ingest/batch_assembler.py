"""Committed transactions of one peek, as Arrow record batches, in bounded memory.

The ingest task's counterpart of :class:`pgpoll.decode.assembler.TransactionAssembler`,
specialised for what a batch peek can contain (whole transactions, no
streaming, no two-phase) and built for speed: changes go straight into
column lists (:class:`pgpoll.sink.envelope.ChangeColumns`) with no object per
change, and pgoutput rows come from the decoder's fast path.

Rows of the open transaction wait for its COMMIT (only then is ``commit_lsn``
known). When a transaction outgrows ``rows_per_batch`` its rows so far are
written to a local Arrow IPC spill file and read back at commit, so a
transaction of any size passes through bounded memory. A transaction whose
commit is at or below ``high_water_mark`` is already in the output and is
dropped; so are pgpoll's heartbeat messages and tables the filter leaves out.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Callable, Iterator, Optional

import pyarrow as pa

from pgpoll.changes import LogicalMessage, Op, RowChange, Truncate
from pgpoll.decode.pgoutput import UNCHANGED_TOAST, RowFields
from pgpoll.sink.envelope import ENVELOPE_SCHEMA, ChangeColumns, with_transaction
from pgpoll.typed.schemas import CatalogTable, TableSchema, schema_from_columns, schema_from_relation

HEARTBEAT_PREFIX = "pgpoll.heartbeat"
_LETTER = {op: op.value for op in Op}  # a dict lookup is cheaper than Enum.value
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _micros(ts: Optional[datetime]) -> Optional[int]:
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return (ts - _EPOCH) // _MICROSECOND


class BatchAssembler:
    """Turns the events of one peek into record batches of committed changes."""

    def __init__(
        self,
        *,
        high_water_mark: Optional[int],
        accepts: Callable[[Optional[str], Optional[str]], bool],
        rows_per_batch: int = 65536,
        type_names: Optional[dict[int, tuple[str, str]]] = None,
        catalog: Optional[Callable[[str, str], Optional[CatalogTable]]] = None,
        row_filters: Optional[Any] = None,
    ) -> None:
        self.hwm = high_water_mark
        self.type_names = type_names if type_names is not None else {}
        self.catalog = catalog
        self.row_filters = row_filters  # pgpoll.rowfilter.evaluate.TableFilters (test_decoding --row-filter)
        self._catalog_cache: dict[tuple[str, str], Optional[CatalogTable]] = {}
        self._relation_schema: dict[Any, str] = {}  # RelationInfo -> schema id (keyed by the object itself)
        self._row_schema: dict[tuple[Any, ...], str] = {}
        #: every table schema a written row refers to, by id
        self.schemas: dict[str, TableSchema] = {}
        self.accepts = accepts
        self.rows_per_batch = rows_per_batch
        self.cols = ChangeColumns()
        self._accepted: dict[int, bool] = {}
        self._in_txn = False
        self._xid: Optional[int] = None
        self._begin_ts: Optional[datetime] = None
        self._spill: Optional[IO[bytes]] = None
        self._spill_writer: Optional[pa.ipc.RecordBatchStreamWriter] = None
        self._spilled_rows = 0
        # what the driver learns
        self.changes = 0
        self.first_commit_lsn: Optional[int] = None
        self.last_commit_lsn: Optional[int] = None
        self.last_commit_ts: Optional[datetime] = None
        self.advance_to: Optional[int] = None

    @property
    def in_transaction(self) -> bool:
        """True between a BEGIN and its COMMIT."""
        return self._in_txn

    # ---- transaction framing ---------------------------------------------------------

    def begin(self, xid: Optional[int], commit_ts: Optional[datetime]) -> None:
        """A transaction starts (pgoutput's Begin already carries the commit time)."""
        self._in_txn = True
        self._xid = xid
        self._begin_ts = commit_ts

    def commit(self, lsn: int, xid: Optional[int], commit_ts: Optional[datetime]) -> Iterator[pa.RecordBatch]:
        """The open transaction committed; ``lsn`` is the COMMIT row's (the commit record's end)."""
        self.advance_to = lsn
        xid = self._xid if self._xid is not None else xid
        commit_ts = commit_ts if commit_ts is not None else self._begin_ts
        ts = _micros(commit_ts)
        self._in_txn = False
        rows = self._spilled_rows + len(self.cols) - self.cols.filled
        if rows == 0 or (self.hwm is not None and lsn <= self.hwm):
            self.cols.drop_unfilled()
            self._close_spill()
            return
        self.first_commit_lsn = lsn if self.first_commit_lsn is None else min(self.first_commit_lsn, lsn)
        self.last_commit_lsn = lsn if self.last_commit_lsn is None else max(self.last_commit_lsn, lsn)
        self.last_commit_ts = commit_ts
        self.changes += rows
        if self._spill_writer is not None:
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

    def row_fields(self, row: RowFields, lsn: int) -> Iterator[pa.RecordBatch]:
        """An INSERT/UPDATE/DELETE from the pgoutput decoder's fast path."""
        op, rel, _xid, before, is_key, after = row
        ok = self._accepted.get(rel.relation_id)
        if ok is None:
            ok = self._accepted[rel.relation_id] = self.accepts(rel.schema, rel.table)
        if not ok:
            return
        sid = self._relation_schema.get(rel)
        if sid is None:
            described = schema_from_relation(rel, self.type_names)
            self.schemas[described.schema_id] = described
            sid = self._relation_schema[rel] = described.schema_id
        names = rel.names
        before_keys: Any = None
        before_values: Any = ()
        if before is not None:
            if is_key:
                before_keys = [names[i] for i in rel.key_indexes]
                before_values = [before[i] for i in rel.key_indexes]
            elif UNCHANGED_TOAST in before:
                kept = [(n, v) for n, v in zip(names, before) if v is not UNCHANGED_TOAST]
                before_keys, before_values = [n for n, _ in kept], [v for _, v in kept]
            else:
                before_keys, before_values = names, before
        after_keys: Any = None
        after_values: Any = ()
        toast: list[str] = []
        if after is not None:
            if UNCHANGED_TOAST in after:
                kept = [(n, v) for n, v in zip(names, after) if v is not UNCHANGED_TOAST]
                toast = [n for n, v in zip(names, after) if v is UNCHANGED_TOAST]
                after_keys, after_values = [n for n, _ in kept], [v for _, v in kept]
            else:
                after_keys, after_values = names, after
        self.cols.add_row(
            lsn, _LETTER[op], rel.schema, rel.table, before_keys, before_values, after_keys, after_values, toast, sid
        )
        if len(self.cols) >= self.rows_per_batch:
            yield from self._flush_if_full()

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
        if self._spill_writer is None:
            self._spill = tempfile.TemporaryFile(prefix="pgpoll-txn-")
            self._spill_writer = pa.ipc.new_stream(self._spill, ENVELOPE_SCHEMA)
        self._spill_writer.write_batch(batch)
        self._spilled_rows += batch.num_rows

    def _read_spill(self, lsn: int, xid: Optional[int], ts: Optional[int]) -> Iterator[pa.RecordBatch]:
        assert self._spill is not None and self._spill_writer is not None
        self._spill_writer.close()
        self._spill.seek(0)
        seq = 0
        for batch in pa.ipc.open_stream(self._spill):
            yield with_transaction(batch, lsn, xid, ts, seq)
            seq += batch.num_rows
        self._close_spill(keep_count=True)

    def _close_spill(self, keep_count: bool = False) -> None:
        if self._spill is not None:
            self._spill.close()
        self._spill = None
        self._spill_writer = None
        if not keep_count:
            self._spilled_rows = 0
