"""The current state of a small table computed in the driver: the changes replayed in order, no Spark job.

:mod:`pgpoll.materialize.state` computes a state with Spark DataFrames:
facts per key, the last one wins, unchanged TOAST values carried over by
window rounds. That is the right shape for millions of rows, but each
Spark job costs a fraction of a second (seconds on a JVM that has just
started), and a table's run takes several: five tables of 1,000 rows
took some 15 s. A table this small is cheaper replayed here, change by
change in ``(commit_lsn, seq)`` order, as PostgreSQL applied them:

* keyed tables: a dict from key to the row; INSERT and UPDATE put the new
  row at its key, an UPDATE that changes the key and a DELETE leave the old
  key *gone* (a tombstone: an unchanged TOAST value looked up there is a
  known null, as the Spark engine's delete fact gives); an UPDATE's
  unchanged TOAST values come from the row it replaces (at the old key), and
  stay unresolved (null, counted) where that row's value is unknown;
* multisets (REPLICA IDENTITY FULL or no key): each distinct row's count is
  the previous count plus INSERTs minus DELETEs, an UPDATE both, with the
  latest ``_commit_lsn`` and ``_commit_ts`` among its changes;
* a TRUNCATE drops the previous state and every earlier change.

Keys, unresolved counts, ``_untyped`` texts and ``_commit_lsn`` are what the
Spark engine gives (tests compare both engines on the same changes). This
module is pure: Arrow tables in, an Arrow table out;
:mod:`pgpoll.materialize.driver.run` reads and writes the files. Cases the
replay does not cover return None from :func:`decline` and go to Spark.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgpoll.materialize.change_summary import ChangeSummary, Position, ShapeSpan
from pgpoll.materialize.state import StateColumn

#: The largest number of change rows (and of previous state rows) a table's run replays in the driver.
DRIVER_ROWS = 100_000
#: The most bytes of Parquet (the changes read, and the previous state) a table's run reads into the driver.
DRIVER_BYTES = 32 << 20
#: The most rows, and bytes of Parquet, of a large Delta state's files an incremental run in the driver
#: rewrites (only the rows at touched keys go through Python; the rest stay Arrow: a few hundred MB at most).
DRIVER_AFFECTED_ROWS = 4_000_000
DRIVER_AFFECTED_BYTES = 128 << 20

_BEFORE = "_before."
_NAN = ("__pgpoll_nan__",)


def present(events: pa.Table, column: StateColumn) -> list[str]:
    """The physical columns of ``column`` the changes hold."""
    return [p for p in column.physical if p in events.column_names]


def decline(events: pa.Table | None, previous: pa.Table | None, columns: Sequence[StateColumn],
            schema: pa.Schema) -> str | None:
    """Why this table's state is computed by Spark after all (None: the replay covers it).

    Values stored under an older type (a column whose type changed) are cast by Spark's rules; the replay
    leaves them to it, in the changes and in the previous state alike.
    """
    if events is not None:
        for c in columns:
            found = present(events, c)
            if len(found) > 1 or (found and found[0] != c.physical[0]):
                return f"column {c.name} holds values of an older type"
    if previous is not None:
        for c in columns:
            if c.name in previous.column_names and not same_type(previous.schema.field(c.name).type,
                                                                 schema.field(c.name).type):
                return f"the previous state's column {c.name} is of another type"
    return None


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two Arrow types hold the same values, the names of list items aside (Spark's Parquet calls
    them ``element``, Arrow ``item``)."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_type(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            same_type(x.type, y.type) for x, y in zip(a, b, strict=True))
    if pa.types.is_map(a) and pa.types.is_map(b):
        return same_type(a.key_type, b.key_type) and same_type(a.item_type, b.item_type)
    return bool(a.equals(b))


def summarize_table(events: pa.Table) -> ChangeSummary:
    """:func:`pgpoll.materialize.change_summary.summarize` of changes held in the driver."""
    ops: list[Any] = events.column("_op").to_pylist()
    lsns: list[Any] = events.column("_commit_lsn").to_pylist()
    seqs: list[Any] = events.column("_seq").to_pylist()
    sids: list[Any] = events.column("_schema_id").to_pylist()
    has_toast = "_unchanged_toast" in events.column_names
    toast: list[Any] = events.column("_unchanged_toast").to_pylist() if has_toast else [None] * len(ops)
    spans: dict[str, tuple[Position, Position]] = {}
    toast_last: dict[str, Position] = {}
    truncate: Position | None = None
    changes = touches = 0
    for op, lsn, seq, sid, unchanged in zip(ops, lsns, seqs, sids, toast, strict=True):
        at = (lsn, seq)
        if sid is not None:
            was = spans.get(sid)
            spans[sid] = (at, at) if was is None else (min(was[0], at), max(was[1], at))
        if op == "T":
            truncate = at if truncate is None else max(truncate, at)
        elif op in ("I", "U", "D"):
            for column in unchanged or ():
                toast_last[column] = max(toast_last.get(column, at), at)
        changes += op in ("I", "U")
        touches += op in ("U", "D")
    shapes = tuple(ShapeSpan(sid, lo, hi) for sid, (lo, hi) in sorted(spans.items()))
    return ChangeSummary(shapes, truncate, toast_last, changes, touches)


def _hashable(value: Any) -> Any:
    """A value as a dict key, equal where Spark's grouping finds them equal (NaN = NaN, -0.0 = 0.0)."""
    if isinstance(value, float):
        return _NAN if math.isnan(value) else value + 0.0
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _grouped(value: Any) -> Any:
    """A value as Spark's grouping gives it back: -0.0 as 0.0, also inside arrays and structs."""
    if isinstance(value, float):
        return value + 0.0
    if isinstance(value, list):
        return [_grouped(v) for v in value]
    if isinstance(value, dict):
        return {k: _grouped(v) for k, v in value.items()}
    return value


@dataclass
class _Changes:
    """The changes as Python columns, in ``(commit_lsn, seq)`` order, after the last TRUNCATE."""

    order: list[int]
    ops: list[Any]
    lsns: list[Any]
    seqs: list[Any]
    stamps: list[Any]
    toast: list[Any]
    untyped: list[Any]
    new: list[list[Any]]  # per state column, each change's value
    old: list[list[Any]]  # per state column, each change's old-row value (None without an old row)
    has_old: list[bool]


def _changes(events: pa.Table, columns: Sequence[StateColumn]) -> tuple[_Changes, bool]:
    """The changes in order after the last TRUNCATE; and whether there was one."""
    n = events.num_rows
    lsns = events.column("_commit_lsn").to_pylist()
    seqs = events.column("_seq").to_pylist()
    ops = events.column("_op").to_pylist()
    order = sorted(range(n), key=lambda i: (lsns[i], seqs[i]))
    truncates = [i for i in order if ops[i] == "T"]
    truncated = bool(truncates)
    if truncated:
        order = order[order.index(truncates[-1]) + 1:]
    order = [i for i in order if ops[i] in ("I", "U", "D")]
    before = events.column("_before") if "_before" in events.column_names else None
    before_fields = {f.name for f in before.type} if before is not None else set()
    combined = before.combine_chunks() if before is not None else None
    new: list[list[Any]] = []
    old: list[list[Any]] = []
    for c in columns:
        found = present(events, c)
        new.append(events.column(found[0]).to_pylist() if found else [None] * n)
        in_before = [p for p in c.physical if p in before_fields]
        old.append(pc.struct_field(combined, in_before[0]).to_pylist() if combined is not None and in_before else [None] * n)
    has_old = (pc.is_valid(before).to_pylist() if before is not None else [False] * n)
    return _Changes(
        order, ops, lsns, seqs, events.column("_commit_ts").to_pylist(),
        events.column("_unchanged_toast").to_pylist() if "_unchanged_toast" in events.column_names else [None] * n,
        events.column("_untyped").to_pylist() if "_untyped" in events.column_names else [None] * n,
        new, old, [bool(h) and ops[i] == "U" for i, h in enumerate(has_old)],
    ), truncated


def _previous_rows(previous: pa.Table | None, columns: Sequence[StateColumn], schema: pa.Schema) -> list[dict[str, Any]]:
    """The previous state's rows (aligned to this run's columns) as Python values."""
    if previous is None:
        return []
    n = previous.num_rows
    values = {c.name: (previous.column(c.name).cast(schema.field(c.name).type).to_pylist() if c.name in previous.column_names
                       else [None] * n) for c in columns}
    untyped = previous.column("_untyped").to_pylist() if "_untyped" in previous.column_names else [None] * n
    lsns = previous.column("_commit_lsn").to_pylist() if "_commit_lsn" in previous.column_names else [None] * n
    stamps = previous.column("_commit_ts").to_pylist() if "_commit_ts" in previous.column_names else [None] * n
    return [{"values": [values[c.name][i] for c in columns], "untyped": untyped[i], "lsn": lsns[i], "ts": stamps[i]}
            for i in range(n)]


@dataclass
class _Row:
    values: list[Any]
    untyped: dict[str, str] | None
    lsn: int | None
    ts: Any
    unknown: frozenset[str] = frozenset()


_GONE = _Row([], None, None, None)  # a key a DELETE or a key-changing UPDATE left: its values are known nulls


def replay(events: pa.Table | None, previous: pa.Table | None, columns: Sequence[StateColumn], key: Sequence[str],
           schema: pa.Schema) -> tuple[pa.Table, int]:
    """The new state (as ``schema``: the columns, ``_untyped``, ``_commit_lsn``, ``_commit_ts``) and the
    number of changes left with an unresolved unchanged TOAST value (see the module docstring).

    Of a keyed table's previous state only the rows at keys a change touches are replayed; the others
    pass through as Arrow, untouched (the new state of a key depends only on its changes and its
    previous row, and a moved row's on its old key, which it touches too).
    """
    changes: _Changes | None = None
    if events is not None:
        changes, truncated = _changes(events, columns)
        if truncated:
            previous = None
    kept: pa.Table | None = None
    if previous is not None:
        previous = _aligned(previous, schema)
        if key:
            at_touched = _touched_rows(previous, _touched_keys(changes, columns, list(key)), columns, list(key))
            kept, previous = previous.filter(pc.invert(at_touched)), previous.filter(at_touched)
    rows = _previous_rows(previous, columns, schema)
    if key:
        out, unresolved = _keyed(changes, rows, columns, list(key))
    else:
        out, unresolved = _multiset(changes, rows, columns), 0
    names = [c.name for c in columns]
    arrays = [pa.array([r.values[j] for r in out], schema.field(name).type) for j, name in enumerate(names)]
    arrays.append(pa.array([None if r.untyped is None else list(r.untyped.items()) for r in out], schema.field("_untyped").type))
    arrays.append(pa.array([r.lsn for r in out], schema.field("_commit_lsn").type))
    arrays.append(pa.array([r.ts for r in out], schema.field("_commit_ts").type))
    replayed = pa.Table.from_arrays(arrays, schema=schema)
    return (replayed if kept is None else pa.concat_tables([kept, replayed])), unresolved


def _aligned(previous: pa.Table, schema: pa.Schema) -> pa.Table:
    """The previous state with this run's columns, in order (a column it lacks: null)."""
    arrays = [previous.column(f.name).cast(f.type) if f.name in previous.column_names else pa.nulls(previous.num_rows, f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _touched_keys(changes: _Changes | None, columns: Sequence[StateColumn], key: list[str]) -> set[Any]:
    """Every key a change puts a row at or takes one from (as :func:`_keyed` forms them)."""
    if changes is None:
        return set()
    names = [c.name for c in columns]
    at = [names.index(k) for k in key]
    out: set[Any] = set()
    for i in changes.order:
        every = dict(changes.untyped[i]) if changes.untyped[i] is not None else {}
        out.add(tuple(_hashable(changes.new[j][i]) for j in at) + tuple(every.get(n) for n in key))
        if changes.has_old[i]:
            out.add(tuple(_hashable(changes.old[j][i]) for j in at) + tuple(every.get(_BEFORE + n) for n in key))
    return out


def touched_key_values(events: pa.Table, columns: Sequence[StateColumn], key: list[str]) -> set[tuple[Any, ...]]:
    """The typed key values every INSERT, UPDATE and DELETE puts a row at or takes one from (for choosing
    files by their key ranges: raw texts aside, a key the typed column cannot hold is null there)."""
    by_name = {c.name: c for c in columns}
    changes, _ = _changes(events, [by_name[k] for k in key])  # only the key columns' values become Python
    out: set[tuple[Any, ...]] = set()
    for i in changes.order:
        out.add(tuple(values[i] for values in changes.new))
        if changes.has_old[i]:
            out.add(tuple(values[i] for values in changes.old))
    return out


def _touched_rows(previous: pa.Table, touched: set[Any], columns: Sequence[StateColumn], key: list[str]) -> Any:
    """Which previous rows are at a touched key (one integer or string key column: with Arrow's ``is_in``,
    and only the rows that hold raw texts in Python)."""
    column = previous.schema.field(key[0]).type
    if len(key) == 1 and (pa.types.is_integer(column) or pa.types.is_string(column)):
        plain = [k[0] for k in touched if k[1] is None and k[0] is not None]
        hits: Any = pc.is_in(previous.column(key[0]), value_set=pa.array(plain, column))
        found: Any = pc.fill_null(hits, pa.scalar(False))
        with_raw = pc.is_valid(previous.column("_untyped"))
        if not pc.any(with_raw).as_py():
            return found
        rows = previous.filter(with_raw)
        exact = _touched_rows_by_value(rows, touched, key).to_pylist()
        mask = found.to_pylist()
        for i, at in enumerate(pc.indices_nonzero(with_raw).to_pylist()):
            mask[at] = exact[i]
        return pa.array(mask, pa.bool_())
    return _touched_rows_by_value(previous, touched, key)


def _touched_rows_by_value(previous: pa.Table, touched: set[Any], key: list[str]) -> pa.Array[Any]:
    values = [previous.column(k).to_pylist() for k in key]
    untyped: list[Any] = previous.column("_untyped").to_pylist()
    mask = []
    for i in range(previous.num_rows):
        raw = dict(untyped[i]) if untyped[i] is not None else {}
        mask.append(tuple(_hashable(v[i]) for v in values) + tuple(raw.get(n) for n in key) in touched)
    return pa.array(mask, pa.bool_())


def _keyed(changes: _Changes | None, rows: list[dict[str, Any]], columns: Sequence[StateColumn],
           key: list[str]) -> tuple[list[_Row], int]:
    names = [c.name for c in columns]
    at = [names.index(k) for k in key]
    state: dict[Any, _Row] = {}
    for r in rows:
        u = dict(r["untyped"]) if r["untyped"] is not None else {}
        k = tuple(_hashable(r["values"][j]) for j in at) + tuple(u.get(name) for name in key)
        state[k] = _Row(r["values"], None if r["untyped"] is None else dict(r["untyped"]), r["lsn"], r["ts"])
    unresolved = 0
    if changes is not None:
        for i in changes.order:
            op = changes.ops[i]
            entries = dict(changes.untyped[i]) if changes.untyped[i] is not None else None
            every = entries or {}
            new = [changes.new[j][i] for j in range(len(columns))]
            new_key = tuple(_hashable(new[j]) for j in at) + tuple(every.get(name) for name in key)
            old_key = new_key
            if changes.has_old[i]:
                old_key = tuple(_hashable(changes.old[j][i]) for j in at) + tuple(every.get(_BEFORE + n) for n in key)
            if op == "D":
                state[old_key] = _GONE
                continue
            source = state.get(old_key)
            if old_key != new_key:
                state[old_key] = _GONE
            own = None if entries is None else {k: v for k, v in entries.items() if not k.startswith(_BEFORE)}
            unknown: set[str] = set()
            for column in changes.toast[i] or ():
                if column not in names:
                    continue
                j = names.index(column)
                if own is not None:
                    own.pop(column, None)
                if source is _GONE:
                    new[j] = None
                elif source is None or column in source.unknown:
                    new[j] = None
                    unknown.add(column)
                else:
                    new[j] = source.values[j]
                    raw = source.untyped.get(column) if source.untyped is not None else None
                    if raw is not None:
                        own = {**(own or {}), column: raw}
            unresolved += bool(unknown)
            state[new_key] = _Row(new, own, changes.lsns[i], changes.stamps[i], frozenset(unknown))
    return [r for r in state.values() if r is not _GONE], unresolved


def _multiset(changes: _Changes | None, rows: list[dict[str, Any]], columns: Sequence[StateColumn]) -> list[_Row]:
    names = [c.name for c in columns]
    counts: Counter[Any] = Counter()
    first: dict[Any, tuple[list[Any], list[tuple[str, str]]]] = {}
    lsn: dict[Any, int] = {}
    stamp: dict[Any, Any] = {}

    def add(values: list[Any], untyped: dict[str, str], n: int, at: int | None, ts: Any) -> None:
        entries = sorted(untyped.items())
        k = (tuple(_hashable(v) for v in values), tuple(entries))
        counts[k] += n
        first.setdefault(k, ([_grouped(v) for v in values], entries))
        if at is not None and at >= 0:
            lsn[k] = max(lsn.get(k, at), at)
        if ts is not None:
            stamp[k] = max(stamp.get(k, ts), ts)
        else:
            stamp.setdefault(k, None)

    for r in rows:
        add(r["values"], dict(r["untyped"] or []), 1, r["lsn"], r["ts"])
    if changes is not None:
        for i in changes.order:
            op = changes.ops[i]
            every = dict(changes.untyped[i] or [])
            main = {k: v for k, v in every.items() if not k.startswith(_BEFORE)}
            old_untyped = {k[len(_BEFORE):]: v for k, v in every.items() if k.startswith(_BEFORE)}
            new = [changes.new[j][i] for j in range(len(columns))]
            old = [changes.old[j][i] for j in range(len(columns))]
            if op in ("I", "U"):
                toast = set(changes.toast[i] or ())
                values = [old[j] if names[j] in toast else new[j] for j in range(len(columns))]
                add(values, main, 1, changes.lsns[i], changes.stamps[i])
            if op == "U" and changes.has_old[i]:
                add(old, old_untyped, -1, changes.lsns[i], changes.stamps[i])
            if op == "D":
                add(new, main, -1, changes.lsns[i], changes.stamps[i])
    out: list[_Row] = []
    for k, n in counts.items():
        values, entries = first[k]
        for _ in range(max(n, 0)):
            out.append(_Row(values, dict(entries) if entries else None, lsn.get(k), stamp.get(k)))
    return out


def predates(events: pa.Table, key: dict[str, str]) -> bool:
    """Whether an UPDATE or DELETE touches a key no change in ``events`` created (``key``: name -> physical),
    as :func:`pgpoll.materialize.snapshot_merge.predates_warning` asks."""
    if not key or any(p not in events.column_names for p in key.values()):
        return False
    ops = events.column("_op").to_pylist()
    new = [events.column(p).to_pylist() for p in key.values()]
    before = events.column("_before") if "_before" in events.column_names else None
    fields = {f.name for f in before.type} if before is not None else set()
    combined = before.combine_chunks() if before is not None else None
    old = [pc.struct_field(combined, p).to_pylist() if combined is not None and p in fields else None for p in key.values()]
    created: set[Any] = set()
    touched: set[Any] = set()
    for i, op in enumerate(ops):
        nk = tuple(_hashable(col[i]) for col in new)
        ok = tuple(_hashable(o[i] if o is not None and o[i] is not None else col[i]) for o, col in zip(old, new, strict=True))
        if op == "I" or (op == "U" and ok != nk):
            created.add(nk)
        if op in ("U", "D"):
            touched.add(ok)
    return bool(touched - created)
