"""Column names Delta forbids without column mapping, stored under a reversible ``%XX`` physical name.

A Delta table without column mapping may not have a column whose name holds
a space or any of ``,;{}()=``, a tab or a newline (Spark's Delta writer
refuses them; other engines follow it). PostgreSQL allows all of them in a
quoted identifier, and the typed tables' ledger keeps them (it only renames
for a type change or a clash with a meta column). Delta's own answer,
column mapping (``delta.columnMapping.mode=name``), is written by delta-rs
1.6.6 as tables that read back as nulls, so pgpoll does not use it.

Instead, a state column goes into the Delta table under its *physical* name:
each forbidden character, and ``%`` itself, as ``%XX`` (its byte in
uppercase hex, as the typed tables' directory names do), every other
character unchanged. Because ``%`` is always escaped the encoding is
one-to-one: ``"a b"`` is ``a%20b`` and a real column named ``"a%20b"`` is
``a%2520b``, so no two columns ever share a physical name, and names that
are equal ignoring case stay so only if the originals are.

The logical name is recorded in the column's own metadata in the Delta
schema, ``{"pgpoll.name": "<name>"}`` (Delta keeps a field's ``metadata``
with the schema; delta-rs carries Arrow field metadata into it, and returns
it when it reads). Readers that know this (pgpoll, or a reader applying
:func:`logical_table`) show the PostgreSQL names; others show the physical
ones, which stay readable (``a%20b``). Columns whose names need no escape
carry no metadata and are unchanged.

Pure functions over names and Arrow schemas: no JVM, no Delta table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa

from pgpoll.materialize.delta.table import DataFile

FORBIDDEN = frozenset(" ,;{}()\n\t=")
"""The characters Delta refuses in a column name without column mapping."""
ESCAPE = "%"
METADATA_KEY = "pgpoll.name"
"""The key of a Delta field's metadata holding the PostgreSQL name of a column stored under a physical name."""

_HEX = frozenset("0123456789ABCDEFabcdef")
V = TypeVar("V")


def needs_encoding(name: str) -> bool:
    """True when ``name`` holds a character Delta forbids, or ``%`` (which the encoding escapes)."""
    return any(ch in FORBIDDEN or ch == ESCAPE for ch in name)


def encode(name: str) -> str:
    """The Delta-safe physical name of column ``name`` (``name`` itself when nothing needs escaping)."""
    return "".join(f"%{ord(ch):02X}" if ch in FORBIDDEN or ch == ESCAPE else ch for ch in name)


def decode(physical: str) -> str:
    """The column name :func:`encode` made ``physical`` from; ValueError for a ``%`` not followed by two hex digits."""
    out: list[str] = []
    i = 0
    while i < len(physical):
        ch = physical[i]
        if ch != ESCAPE:
            out.append(ch)
            i += 1
            continue
        code = physical[i + 1:i + 3]
        if len(code) != 2 or not set(code) <= _HEX:
            raise ValueError(f"{physical!r} is no physical column name: '%' at {i} is not followed by two hex digits")
        out.append(chr(int(code, 16)))
        i += 3
    return "".join(out)


def physical_names(names: Sequence[str]) -> dict[str, str]:
    """``{name: physical name}`` for the columns ``names``; ValueError when two would share a physical name
    (only possible when ``names`` repeats a name: the encoding is one-to-one)."""
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for name in names:
        physical = encode(name)
        if physical in taken:
            raise ValueError(f"columns {taken[physical]!r} and {name!r} would both be stored as {physical!r}")
        taken[physical] = name
        out[name] = physical
    return out


def field_metadata(name: str) -> dict[str, str]:
    """The metadata recorded on the Delta field of column ``name`` (empty when its name is stored as it is)."""
    return {METADATA_KEY: name} if needs_encoding(name) else {}


def logical_names(fields: Iterable[tuple[str, Mapping[str, Any] | None]]) -> dict[str, str]:
    """``{physical name: column name}`` from ``(field name, field metadata)`` pairs of a table's schema.

    A field with ``pgpoll.name`` in its metadata maps to that name; any other
    keeps its own (written before the encoding, or by another tool).
    """
    out: dict[str, str] = {}
    for physical, meta in fields:
        logical = (meta or {}).get(METADATA_KEY)
        out[physical] = logical if isinstance(logical, str) else physical
    return out


def delta_schema_names(schema_json: str) -> dict[str, str]:
    """:func:`logical_names` of a Delta schema's JSON (``DeltaTable.schema().to_json()``, or ``schemaString``)."""
    data = json.loads(schema_json)
    return logical_names((str(f["name"]), f.get("metadata")) for f in data.get("fields", []))


def _arrow_meta(fld: pa.Field[Any]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (fld.metadata or {}).items()}


def arrow_names(schema: pa.Schema) -> dict[str, str]:
    """:func:`logical_names` of an Arrow schema read from the table (deltalake keeps field metadata)."""
    return logical_names((f.name, _arrow_meta(f)) for f in schema)


def encode_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each column under its physical name, the PostgreSQL name in the field's metadata;
    ``deltalake.Schema.from_arrow`` of it is the Delta schema to commit."""
    physical = physical_names(schema.names)
    fields = []
    for f in schema:
        meta = {**_arrow_meta(f), **field_metadata(f.name)}
        fields.append(pa.field(physical[f.name], f.type, f.nullable, meta or None))
    kept: dict[bytes | str, bytes | str] = {k: v for k, v in (schema.metadata or {}).items()}
    return pa.schema(fields, metadata=kept or None)


def logical_table(table: pa.Table) -> pa.Table:
    """``table`` (read from a pgpoll Delta table, e.g. :func:`pgpoll.sink.delta_read.read_delta`) with its columns
    under their PostgreSQL names."""
    names = arrow_names(table.schema)
    return table.rename_columns([names[n] for n in table.column_names])


def rename_keys(values: Mapping[str, V], names: Mapping[str, str]) -> dict[str, V]:
    """``values`` (keyed by physical name) keyed by column name (``names``: from :func:`delta_schema_names`)."""
    return {names.get(k, k): v for k, v in values.items()}


def logical_stats(files: Sequence[DataFile], names: Mapping[str, str]) -> tuple[DataFile, ...]:
    """``files`` as the Delta log describes them (statistics keyed by physical name), keyed by column name."""
    if all(k == v for k, v in names.items()):
        return tuple(files)
    return tuple(replace(f, min_values=rename_keys(f.min_values, names), max_values=rename_keys(f.max_values, names),
                         null_count=rename_keys(f.null_count, names)) for f in files)
