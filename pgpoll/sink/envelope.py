"""The change envelope as Arrow and Spark see it, and a column-wise builder of it.

Columns, exactly (docs/reference/output-contract.md): ``commit_lsn`` bigint,
``lsn`` bigint, ``seq`` int, ``xid`` bigint (the full 64-bit transaction id,
epoch in the high 32 bits, as ``pg_current_xact_id()``; the batch assembler
widens the plugin's 32-bit id), ``commit_ts`` timestamp (UTC),
``op`` string, ``schema_name``, ``table_name`` string, ``before``, ``after``
map<string,string>, ``unchanged_toast`` array<string>, ``message_prefix``
string, ``message_content`` binary, ``transactional`` boolean, ``schema_id`` string
(the table's shape when the change was made: ``_pgpoll/schemas/<id>.json``,
see :mod:`pgpoll.typed.schemas`; null for messages). The
``lsn_range`` partition column comes from the directory name.

:class:`ChangeColumns` collects changes straight into Python lists, one per
column (a map column as flat keys, values and offsets), with no object per
change; converting to Arrow is then a handful of C-level calls. The
transaction columns (``commit_lsn``, ``seq``, ``xid``, ``commit_ts``) of the
rows of an open transaction are filled in when it commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_MAP = pa.map_(pa.string(), pa.string())
_TS = pa.timestamp("us", tz="UTC")
#: The LSNs of rows built column-wise: a list, or a NumPy slice of the peek's column (no copy into Arrow).
Lsns = Sequence[int] | npt.NDArray[np.int64]

_FIELDS: list[pa.Field[Any]] = [
        pa.field("commit_lsn", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("seq", pa.int32()),
        pa.field("xid", pa.int64()),
        pa.field("commit_ts", _TS),
        pa.field("op", pa.string()),
        pa.field("schema_name", pa.string()),
        pa.field("table_name", pa.string()),
        pa.field("before", _MAP),
        pa.field("after", _MAP),
        pa.field("unchanged_toast", pa.list_(pa.string())),
        pa.field("message_prefix", pa.string()),
        pa.field("message_content", pa.binary()),
        pa.field("transactional", pa.bool_()),
        pa.field("schema_id", pa.string()),
]
ENVELOPE_SCHEMA = pa.schema(_FIELDS)

SPARK_DDL = (
    "commit_lsn bigint, lsn bigint, seq int, xid bigint, commit_ts timestamp, op string, "
    "schema_name string, table_name string, before map<string,string>, after map<string,string>, "
    "unchanged_toast array<string>, message_prefix string, message_content binary, transactional boolean, "
    "schema_id string"
)

_NO_TOAST: list[str] = []


class _MapColumn:
    """A map<string,string> column as flat keys/values plus offsets; ``None`` rows are null maps."""

    __slots__ = ("keys", "nulls", "offsets", "values")

    def __init__(self) -> None:
        self.offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str | None] = []
        self.nulls: list[int] = []  # row numbers of null maps

    def add(self, keys: Iterable[str] | None, values: Iterable[str | None] = ()) -> None:
        if keys is None:
            self.nulls.append(len(self.offsets) - 1)
        else:
            self.keys.extend(keys)
            self.values.extend(values)
        self.offsets.append(len(self.keys))

    def slice_arrays(self, start: int, stop: int) -> pa.Array[Any]:
        """Rows ``start..stop`` as a MapArray."""
        lo, hi = self.offsets[start], self.offsets[stop]
        offsets = pa.array([o - lo for o in self.offsets[start : stop + 1]], pa.int32())
        nulls = [n - start for n in self.nulls if start <= n < stop]
        if nulls:
            mask = [False] * (stop - start + 1)
            for n in nulls:
                mask[n] = True
            offsets = pc.if_else(pa.array(mask, pa.bool_()), pa.scalar(None, pa.int32()), offsets)
        # pyarrow-stubs type the offsets as one array class; if_else returns another (both are int32 arrays)
        return pa.MapArray.from_arrays(  # type: ignore[call-overload,no-any-return]
            offsets, pa.array(self.keys[lo:hi], pa.string()), pa.array(self.values[lo:hi], pa.string())
        )

    def truncate(self, rows: int) -> None:
        """Keep only the first ``rows`` rows."""
        end = self.offsets[rows]
        del self.offsets[rows + 1 :]
        del self.keys[end:]
        del self.values[end:]
        self.nulls = [n for n in self.nulls if n < rows]


class ChangeColumns:
    """The change envelope, column by column, for the rows of one Arrow record batch."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Start empty."""
        self.commit_lsn: list[int | None] = []
        self.lsn: list[int | None] = []
        self.seq: list[int] = []
        self.xid: list[int | None] = []
        self.commit_ts: list[int | None] = []  # microseconds since 1970-01-01 UTC
        self.op: list[str] = []
        self.schema_name: list[str | None] = []
        self.table_name: list[str | None] = []
        self.before = _MapColumn()
        self.after = _MapColumn()
        self.unchanged_toast: list[list[str]] = []
        self.message_prefix: list[str | None] = []
        self.message_content: list[bytes | None] = []
        self.transactional: list[bool | None] = []
        self.schema_id: list[str | None] = []

    def __len__(self) -> int:
        return len(self.op)

    def add_row(
        self,
        lsn: int | None,
        op: str,
        schema: str,
        table: str,
        before_keys: Sequence[str] | None,
        before_values: Sequence[str | None],
        after_keys: Sequence[str] | None,
        after_values: Sequence[str | None],
        unchanged_toast: list[str] = _NO_TOAST,
        schema_id: str | None = None,
    ) -> None:
        """One INSERT/UPDATE/DELETE/TRUNCATE row (transaction columns filled later)."""
        self.lsn.append(lsn)
        self.op.append(op)
        self.schema_name.append(schema)
        self.table_name.append(table)
        self.before.add(before_keys, before_values)
        self.after.add(after_keys, after_values)
        self.unchanged_toast.append(unchanged_toast)
        self.message_prefix.append(None)
        self.message_content.append(None)
        self.transactional.append(None)
        self.schema_id.append(schema_id)

    def add_message(self, lsn: int | None, prefix: str, content: bytes, transactional: bool) -> None:
        """One logical message row (op ``M``)."""
        self.lsn.append(lsn)
        self.op.append("M")
        self.schema_name.append(None)
        self.table_name.append(None)
        self.before.add(None)
        self.after.add(None)
        self.unchanged_toast.append(_NO_TOAST)
        self.message_prefix.append(prefix)
        self.message_content.append(content)
        self.transactional.append(transactional)
        self.schema_id.append(None)

    def fill_transaction(self, commit_lsn: int | None, xid: int | None, commit_ts: int | None, first_seq: int) -> None:
        """Set the transaction columns of every row added since they were last filled."""
        start = len(self.seq)
        n = len(self.op) - start
        self.commit_lsn.extend([commit_lsn] * n)
        self.xid.extend([xid] * n)
        self.commit_ts.extend([commit_ts] * n)
        self.seq.extend(range(first_seq, first_seq + n))

    @property
    def filled(self) -> int:
        """Rows whose transaction columns are set (the rest belong to the open transaction)."""
        return len(self.seq)

    def drop_unfilled(self) -> None:
        """Forget the rows of the open transaction."""
        keep = len(self.seq)
        for column in (self.lsn, self.op, self.schema_name, self.table_name, self.unchanged_toast,
                       self.message_prefix, self.message_content, self.transactional, self.schema_id):
            del column[keep:]
        self.before.truncate(keep)
        self.after.truncate(keep)

    def to_batch(self, start: int = 0, stop: int | None = None, *, unfilled: bool = False) -> pa.RecordBatch:
        """Rows ``start..stop`` as a record batch; ``unfilled`` leaves the transaction columns null."""
        stop = len(self) if stop is None else stop
        n = stop - start

        def tx(values: list, kind: pa.DataType) -> pa.Array:  # type: ignore[type-arg]
            # pyarrow-stubs have one overload of nulls per concrete type, none for a plain DataType
            return pa.nulls(n, kind) if unfilled else pa.array(values[start:stop], kind)  # type: ignore[call-overload]

        arrays = [
            tx(self.commit_lsn, pa.int64()),
            pa.array(self.lsn[start:stop], pa.int64()),
            tx(self.seq, pa.int32()),
            tx(self.xid, pa.int64()),
            pa.nulls(n, _TS) if unfilled else pa.array(self.commit_ts[start:stop], pa.int64()).cast(_TS),
            pa.array(self.op[start:stop], pa.string()),
            pa.array(self.schema_name[start:stop], pa.string()),
            pa.array(self.table_name[start:stop], pa.string()),
            self.before.slice_arrays(start, stop),
            self.after.slice_arrays(start, stop),
            pa.array(self.unchanged_toast[start:stop], pa.list_(pa.string())),
            pa.array(self.message_prefix[start:stop], pa.string()),
            pa.array(self.message_content[start:stop], pa.binary()),
            pa.array(self.transactional[start:stop], pa.bool_()),
            pa.array(self.schema_id[start:stop], pa.string()),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_SCHEMA)


def _empty_lists(n: int) -> pa.Array[Any]:
    """``n`` empty ``list<string>`` values (not nulls: what ``add_row`` gives a row without unchanged TOAST)."""
    offsets: Any = pa.array(np.zeros(n + 1, np.int32), pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array([], pa.string()))


def insert_rows_batch(
    lsns: Lsns, schema: str, table: str, after: pa.MapArray[Any, Any], schema_id: str
) -> pa.RecordBatch:
    """INSERT rows of one table with their ``after`` images already in Arrow (transaction columns null).

    What :meth:`ChangeColumns.add_row` and :meth:`ChangeColumns.to_batch`
    give for the same rows, built column-wise (:mod:`pgpoll.decode.pgoutput_columns`).
    """
    n = len(after)
    arrays: list[pa.Array[Any]] = [
        pa.nulls(n, pa.int64()),
        pa.array(lsns, pa.int64()),
        pa.nulls(n, pa.int32()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, _TS),
        pa.repeat(pa.scalar("I", pa.string()), n),
        pa.repeat(pa.scalar(schema, pa.string()), n),
        pa.repeat(pa.scalar(table, pa.string()), n),
        pa.nulls(n, _MAP),
        after,
        _empty_lists(n),
        pa.nulls(n, pa.string()),
        pa.nulls(n, pa.binary()),
        pa.nulls(n, pa.bool_()),
        pa.repeat(pa.scalar(schema_id, pa.string()), n),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_SCHEMA)


def with_transaction(batch: pa.RecordBatch, commit_lsn: int | None, xid: int | None,
                     commit_ts: int | None, first_seq: int) -> pa.RecordBatch:
    """``batch`` (written with null transaction columns) with them filled in."""
    n = batch.num_rows
    columns = list(batch.columns)
    columns[0] = pa.repeat(pa.scalar(commit_lsn, pa.int64()), n)
    columns[2] = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int32))
    columns[3] = pa.repeat(pa.scalar(xid, pa.int64()), n)
    columns[4] = pa.repeat(pa.scalar(commit_ts, pa.int64()), n).cast(_TS)
    return pa.RecordBatch.from_arrays(columns, schema=ENVELOPE_SCHEMA)
