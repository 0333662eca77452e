"""The change envelope as Arrow and Spark see it, and a builder of Arrow record batches.

Columns, exactly (the README's output contract): ``commit_lsn`` bigint,
``lsn`` bigint, ``seq`` int, ``xid`` bigint, ``commit_ts`` timestamp (UTC),
``op`` string, ``schema_name``, ``table_name`` string, ``before``, ``after``
map<string,string>, ``unchanged_toast`` array<string>, ``message_prefix``
string, ``message_content`` binary, ``transactional`` boolean. The
``lsn_range`` partition column comes from the directory name.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from pgpoll.changes import ChangeRecord

_MAP = pa.map_(pa.string(), pa.string())

ENVELOPE_SCHEMA = pa.schema(
    [
        pa.field("commit_lsn", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("seq", pa.int32()),
        pa.field("xid", pa.int64()),
        pa.field("commit_ts", pa.timestamp("us", tz="UTC")),
        pa.field("op", pa.string()),
        pa.field("schema_name", pa.string()),
        pa.field("table_name", pa.string()),
        pa.field("before", _MAP),
        pa.field("after", _MAP),
        pa.field("unchanged_toast", pa.list_(pa.string())),
        pa.field("message_prefix", pa.string()),
        pa.field("message_content", pa.binary()),
        pa.field("transactional", pa.bool_()),
    ]
)

SPARK_DDL = (
    "commit_lsn bigint, lsn bigint, seq int, xid bigint, commit_ts timestamp, op string, "
    "schema_name string, table_name string, before map<string,string>, after map<string,string>, "
    "unchanged_toast array<string>, message_prefix string, message_content binary, transactional boolean"
)


class _MapColumn:
    """Builds a map<string,string> column from flat keys/values and offsets (no per-row Arrow calls)."""

    __slots__ = ("offsets", "keys", "values", "valid")

    def __init__(self) -> None:
        self.offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[Optional[str]] = []
        self.valid: list[bool] = []

    def append(self, row: Optional[Mapping[str, Optional[str]]]) -> None:
        if row is None:
            self.valid.append(False)
        else:
            self.keys.extend(row.keys())
            self.values.extend(row.values())
            self.valid.append(True)
        self.offsets.append(len(self.keys))

    def finish(self) -> pa.Array:
        offsets = pa.array(self.offsets, pa.int32())
        if not all(self.valid):
            mask = pa.array([not v for v in self.valid] + [False], pa.bool_())
            offsets = pa.compute.if_else(mask, pa.scalar(None, pa.int32()), offsets)
        return pa.MapArray.from_arrays(offsets, pa.array(self.keys, pa.string()), pa.array(self.values, pa.string()))


class EnvelopeBuilder:
    """Collects :class:`ChangeRecord` values column by column into Arrow record batches."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.commit_lsn: list[Optional[int]] = []
        self.lsn: list[Optional[int]] = []
        self.seq: list[int] = []
        self.xid: list[Optional[int]] = []
        self.commit_ts: list[Any] = []
        self.op: list[str] = []
        self.schema_name: list[Optional[str]] = []
        self.table_name: list[Optional[str]] = []
        self.before = _MapColumn()
        self.after = _MapColumn()
        self.unchanged_toast: list[Optional[list[str]]] = []
        self.message_prefix: list[Optional[str]] = []
        self.message_content: list[Optional[bytes]] = []
        self.transactional: list[Optional[bool]] = []

    def __len__(self) -> int:
        return len(self.seq)

    def append(self, r: ChangeRecord) -> None:
        """Add one record."""
        self.commit_lsn.append(r.commit_lsn)
        self.lsn.append(r.lsn)
        self.seq.append(r.seq)
        self.xid.append(r.xid)
        self.commit_ts.append(r.commit_ts)
        self.op.append(r.op.value if hasattr(r.op, "value") else str(r.op))
        self.schema_name.append(r.schema_name)
        self.table_name.append(r.table_name)
        self.before.append(r.before)
        self.after.append(r.after)
        self.unchanged_toast.append(list(r.unchanged_toast))
        self.message_prefix.append(r.message_prefix)
        self.message_content.append(r.message_content)
        self.transactional.append(r.transactional)

    def extend(self, records: Iterable[ChangeRecord]) -> None:
        """Add several records."""
        for r in records:
            self.append(r)

    def flush(self) -> pa.RecordBatch:
        """The collected records as one record batch; the builder starts empty again."""
        arrays = [
            pa.array(self.commit_lsn, pa.int64()),
            pa.array(self.lsn, pa.int64()),
            pa.array(self.seq, pa.int32()),
            pa.array(self.xid, pa.int64()),
            pa.array(self.commit_ts, pa.timestamp("us", tz="UTC")),
            pa.array(self.op, pa.string()),
            pa.array(self.schema_name, pa.string()),
            pa.array(self.table_name, pa.string()),
            self.before.finish(),
            self.after.finish(),
            pa.array(self.unchanged_toast, pa.list_(pa.string())),
            pa.array(self.message_prefix, pa.string()),
            pa.array(self.message_content, pa.binary()),
            pa.array(self.transactional, pa.bool_()),
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_SCHEMA)
