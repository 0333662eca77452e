"""Change envelope rows of one table -> that table's typed change rows (Arrow in, Arrow out).

A typed change row holds the table's own columns, typed by
:mod:`pgpoll.typed.mapping` — the new row for INSERT and UPDATE, the old row
(or old key) for DELETE, nothing for TRUNCATE — plus:

============== ============================ ==============================================
``_op``        string                       I, U, D or T
``_commit_lsn`` bigint                      LSN of the transaction's commit
``_seq``       int                          position in the transaction
``_commit_ts`` timestamp (UTC)              commit time
``_xid``       bigint                       the transaction's full 64-bit id (as ``pg_current_xact_id()``)
``_unchanged_toast`` array<string>          columns whose unchanged TOASTed value was not sent (null here)
``_before``    struct<the table's columns>  UPDATE: the old key or old row when the stream sent one
``_untyped``   map<string,string>           exact text of values the typed column cannot hold
                                            (NaN in a decimal, infinity dates, ...); ``_before.<col>`` for old values
``_schema_id`` string                       the table's shape, ``_pgpoll/schemas/<id>.json``
============== ============================ ==============================================

Column names are mapped to *physical* names by a :class:`ColumnLedger`, kept
per table for the table's whole history: a column keeps its name while its
Spark type stays the same; a type change writes the column from then on as
``<name>__<type tag>`` (Spark cannot merge, say, int and string under one
name); a name equal to a meta column or equal to another ignoring case (Spark
is case-insensitive) gets a suffix too. The ledger is what makes the same
column land in the same place in every batch, so ``mergeSchema`` reads all
partitions. ``_xid`` joined the meta columns later: a ledger written before
that with a column stored as ``_xid`` is refused (:class:`SinkError`) rather
than mixed up with it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pgpoll.errors import SinkError
from pgpoll.typed.conversions import to_arrow
from pgpoll.typed.mapping import PgType, arrow_type, spark_ddl, type_tag
from pgpoll.typed.schemas import TableSchema

META_COLUMNS = (
    "_op", "_commit_lsn", "_seq", "_commit_ts", "_xid", "_unchanged_toast", "_before", "_untyped", "_schema_id",
)
_META_LOWER = frozenset(m.lower() for m in META_COLUMNS)
_TS = pa.timestamp("us", tz="UTC")


@dataclass
class LedgerEntry:
    """One (column name, Spark type) pair and where it is stored."""

    name: str
    ddl: str
    physical: str
    type: PgType

    def to_json(self) -> dict[str, Any]:
        """As stored in the ledger file."""
        return {"name": self.name, "spark_type": self.ddl, "physical": self.physical, "type": self.type.to_json()}


@dataclass
class ColumnLedger:
    """Physical column names of one table, in order of first appearance, for its whole history."""

    entries: list[LedgerEntry] = field(default_factory=list)
    changed: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColumnLedger:
        """Parse the ledger file's content."""
        return cls(
            [LedgerEntry(e["name"], e["spark_type"], e["physical"], PgType.from_json(e["type"])) for e in data.get("columns", ())]
        )

    def to_json(self) -> dict[str, Any]:
        """The ledger file's content."""
        return {"columns": [e.to_json() for e in self.entries]}

    def physical(self, name: str, t: PgType) -> str:
        """The stored name of column ``name`` with type ``t`` (a new entry when first seen)."""
        ddl = spark_ddl(t)
        for e in self.entries:
            if e.name == name and e.ddl == ddl:
                return e.physical
        taken = {e.physical.lower() for e in self.entries} | _META_LOWER
        first_type = next((e for e in self.entries if e.name == name), None)
        base = candidate = name if first_type is None else f"{name}__{type_tag(t)}"
        n = 1
        while candidate.lower() in taken:
            n += 1
            candidate = f"{base}__{n}"
        self.entries.append(LedgerEntry(name, ddl, candidate, t))
        self.changed = True
        return candidate


@dataclass(frozen=True)
class TypedLayout:
    """The typed columns of one table in one batch: ``(physical name, column name, type)`` in order."""

    columns: tuple[tuple[str, str, PgType], ...]
    #: schema id -> {column name: physical name}
    physical: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def build(cls, schemas: Iterable[TableSchema], ledger: ColumnLedger) -> TypedLayout:
        """Every column the table ever had (``schemas`` registered first), named through ``ledger``.

        Every partition carries every physical column the table has had so
        far (null where a change did not have it), so partitions differ only
        by columns added later, which ``mergeSchema`` handles.
        """
        physical: dict[str, dict[str, str]] = {}
        shapes = list(schemas)
        clash = next((e for e in ledger.entries if e.physical.lower() in _META_LOWER), None)
        if clash is not None:
            where = f"{shapes[0].schema}.{shapes[0].table}" if shapes else "a table"
            raise SinkError(
                f'typed table {where} stores its column "{clash.name}" as "{clash.physical}", now the name of '
                "a pgpoll meta column (written before pgpoll added it)",
                "write this table's typed changes to a new output, or move its typed files and column ledger "
                "(_pgpoll/tables/) aside and run `pgpoll snapshot --tables` for the table",
            )
        for described in shapes:
            names = physical.setdefault(described.schema_id, {})
            for c in described.columns:
                names[c.name] = ledger.physical(c.name, c.type)
        return cls(tuple((e.physical, e.name, e.type) for e in ledger.entries), physical)

    def arrow_schema(self) -> pa.Schema:
        """The typed change rows' Arrow schema."""
        own = [pa.field(p, arrow_type(t)) for p, _n, t in self.columns]
        return pa.schema([
            *own,
            pa.field("_op", pa.string()),
            pa.field("_commit_lsn", pa.int64()),
            pa.field("_seq", pa.int32()),
            pa.field("_commit_ts", _TS),
            pa.field("_xid", pa.int64()),
            pa.field("_unchanged_toast", pa.list_(pa.string())),
            pa.field("_before", pa.struct(own) if own else pa.struct([pa.field("_none", pa.int8())])),
            pa.field("_untyped", pa.map_(pa.string(), pa.string())),
            pa.field("_schema_id", pa.string()),
        ])

    def spark_ddl(self) -> str:
        """The same schema as a Spark DDL string (names back-quoted)."""
        own = [f"{quote(p)}: {spark_ddl(t)}" for p, _n, t in self.columns]
        before = ", ".join(own) if own else "`_none`: tinyint"
        cols = [o.replace(": ", " ", 1) for o in own] + [
            "`_op` string", "`_commit_lsn` bigint", "`_seq` int", "`_commit_ts` timestamp", "`_xid` bigint",
            "`_unchanged_toast` array<string>", f"`_before` struct<{before}>", "`_untyped` map<string,string>",
            "`_schema_id` string",
        ]
        return ", ".join(cols)


def quote(name: str) -> str:
    """A Spark identifier, back-quoted."""
    return "`" + name.replace("`", "``") + "`"


def typed_batch(batch: pa.RecordBatch, layout: TypedLayout) -> pa.RecordBatch:
    """Envelope rows (of one table) as typed change rows."""
    ops: list[str | None] = batch.column("op").to_pylist()
    sids: list[str | None] = batch.column("schema_id").to_pylist()
    befores: list[list[tuple[str, str | None]] | None] = batch.column("before").to_pylist()
    afters: list[list[tuple[str, str | None]] | None] = batch.column("after").to_pylist()
    n = len(ops)
    main: list[dict[str, str | None] | None] = []
    old: list[dict[str, str | None] | None] = []
    for op, before_image, after_image in zip(ops, befores, afters, strict=True):
        if op == "D":
            main.append(dict(before_image or ()))
            old.append(None)
        elif op in ("I", "U"):
            main.append(dict(after_image or ()))
            old.append(dict(before_image) if op == "U" and before_image is not None else None)
        else:
            main.append(None)
            old.append(None)
    untyped: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    own_main = _typed_columns(layout, sids, main, untyped, "")
    own_old = _typed_columns(layout, sids, old, untyped, "_before.")
    target = layout.arrow_schema()
    before_type = target.field("_before").type
    if layout.columns:
        mask = pa.array([o is None for o in old], pa.bool_())
        before = pa.StructArray.from_arrays(own_old, fields=list(before_type), mask=mask)
    else:
        before = pa.nulls(n, before_type)
    untyped_col = pa.array([u if u else None for u in untyped], pa.map_(pa.string(), pa.string()))
    return assemble_typed_batch(batch, target, own_main, before, untyped_col)


def assemble_typed_batch(
    batch: pa.RecordBatch, target: pa.Schema, own: Sequence[pa.Array[Any]], before: pa.Array[Any],
    untyped: pa.Array[Any],
) -> pa.RecordBatch:
    """The typed change batch: the table's own columns, the envelope's working columns, ``_before``, ``_untyped``.

    The working columns pass through from the envelope ``batch``, cast to the
    target's types (Spark's Arrow types differ in time zone and list field names).
    """

    def passed(source: str, into: str) -> pa.Array[Any]:
        return batch.column(source).cast(target.field(into).type)

    arrays = [
        *own,
        passed("op", "_op"),
        passed("commit_lsn", "_commit_lsn"),
        passed("seq", "_seq"),
        passed("commit_ts", "_commit_ts"),
        passed("xid", "_xid"),
        passed("unchanged_toast", "_unchanged_toast"),
        before,
        untyped,
        passed("schema_id", "_schema_id"),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _typed_columns(
    layout: TypedLayout, sids: Sequence[str | None], images: Sequence[dict[str, str | None] | None],
    untyped: list[list[tuple[str, str]]], prefix: str,
) -> list[pa.Array[Any]]:
    arrays: list[pa.Array[Any]] = []
    for phys, name, t in layout.columns:
        holders = {sid for sid, names in layout.physical.items() if names.get(name) == phys}
        texts = [
            image.get(name) if image is not None and sid in holders else None
            for sid, image in zip(sids, images, strict=True)
        ]
        array, fallback = to_arrow(t, texts)
        for i in fallback:
            text = texts[i]
            if text is not None:
                untyped[i].append((prefix + name, text))
        arrays.append(array)
    return arrays
