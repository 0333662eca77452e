"""What a captured table looked like when a change was made: its columns, their types, its key.

A :class:`TableSchema` is built from what the stream says — pgoutput's
Relation (and Type) messages, or the column names and type names on each
test_decoding line plus the replica identity looked up in the catalog — and
is identified by a content hash (:attr:`TableSchema.schema_id`). Every change
row of the envelope carries the id of the schema it was made under
(``schema_id``); the schema itself is stored once, as JSON, under
``PATH/_pgpoll/schemas/<schema_id>.json``. Because the id is a hash of the
content, the same table shape always gets the same id and writing it twice
is harmless.

Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgpoll.typed.mapping import PgType, type_from_name, type_from_oid

#: replica identity codes as pg_class.relreplident prints them
IDENTITY_DEFAULT = "d"
IDENTITY_INDEX = "i"
IDENTITY_FULL = "f"
IDENTITY_NOTHING = "n"


@dataclass(frozen=True)
class ColumnSchema:
    """One column: its name and PostgreSQL type."""

    name: str
    type: PgType


@dataclass(frozen=True)
class TableSchema:
    """The shape of one table at one point in its history.

    ``key`` names the replica-identity columns (every column under REPLICA
    IDENTITY FULL, none under NOTHING or when unknown); ``identity`` is the
    ``relreplident`` code when known. ``partial`` marks a schema seen only
    through a DELETE's old key (test_decoding prints no other columns then).
    """

    schema: str
    table: str
    columns: tuple[ColumnSchema, ...]
    key: tuple[str, ...] = ()
    identity: str | None = None
    partial: bool = False
    schema_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.schema_id:
            digest = hashlib.sha256(json.dumps(self._content(), sort_keys=True).encode()).hexdigest()[:20]
            object.__setattr__(self, "schema_id", digest)

    @property
    def qualified_name(self) -> str:
        """``schema.table`` (unquoted, for messages and keys)."""
        return f"{self.schema}.{self.table}"

    @property
    def names(self) -> tuple[str, ...]:
        """Column names in table order."""
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> ColumnSchema | None:
        """The column called ``name``, or None."""
        for c in self.columns:
            if c.name == name:
                return c
        return None

    def _content(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "columns": [{"name": c.name, "type": c.type.to_json()} for c in self.columns],
            "key": list(self.key),
            "identity": self.identity,
            "partial": self.partial,
        }

    def to_json(self) -> str:
        """The schema as one JSON document (what ``_pgpoll/schemas/<id>.json`` holds)."""
        data = self._content()
        data["schema_id"] = self.schema_id
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TableSchema:
        """Parse :meth:`to_json`'s output."""
        data = json.loads(text)
        return cls(
            schema=data["schema"],
            table=data["table"],
            columns=tuple(ColumnSchema(c["name"], PgType.from_json(c["type"])) for c in data["columns"]),
            key=tuple(data.get("key", ())),
            identity=data.get("identity"),
            partial=bool(data.get("partial", False)),
        )


def schema_from_relation(rel: Any, type_names: Mapping[int, tuple[str, str]]) -> TableSchema:
    """The schema a pgoutput Relation message describes (``rel`` is the decoder's RelationInfo).

    pgoutput flags the replica-identity columns (all of them under FULL);
    ``type_names`` are the decoder's Type messages (OID -> schema, name).
    """
    columns = tuple(
        ColumnSchema(c.name, type_from_oid(int(c.type_oid), int(c.type_modifier), type_names)) for c in rel.columns
    )
    key = tuple(c.name for c in rel.columns if c.is_key)
    identity = rel.replica_identity if rel.replica_identity in ("d", "i", "f", "n") else None
    return TableSchema(rel.schema, rel.table, columns, key, identity)


@dataclass(frozen=True)
class CatalogTable:
    """What the catalog says of a table now: identity, key columns, full column types.

    ``base_types`` maps a column to ``(type as test_decoding prints it, full
    type)``: the full type has the modifier (``numeric(10,2)``) and, for a
    domain, is its base type; both as ``format_type`` prints them.
    """

    identity: str | None
    key: tuple[str, ...]
    base_types: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def schema_from_columns(
    schema: str, table: str, columns: Sequence[tuple[str, str | None]], catalog: CatalogTable | None, *,
    partial: bool = False,
) -> TableSchema:
    """The schema of a test_decoding row: its ``(name, type name)`` pairs plus the catalog's identity.

    A column whose printed type is what the catalog has for it now gets the
    catalog's full type (with its modifier; a domain's base type). Under
    REPLICA IDENTITY FULL every column is key.
    """
    bases = catalog.base_types if catalog is not None else {}
    cols: list[ColumnSchema] = []
    for name, type_name in columns:
        declared = type_name or "text"
        base = bases.get(name)
        if base is not None and _same_type_name(base[0], declared):
            declared = base[1]
        cols.append(ColumnSchema(name, type_from_name(declared)))
    identity = catalog.identity if catalog is not None else None
    if identity == IDENTITY_FULL:
        key = tuple(c.name for c in cols)
    else:
        key = tuple(k for k in (catalog.key if catalog is not None else ()) if any(c.name == k for c in cols) or partial)
    return TableSchema(schema, table, tuple(cols), key, identity, partial)


def _same_type_name(catalog_name: str, printed: str) -> bool:
    """format_type may schema-qualify a name the stream printed bare (or the reverse)."""
    if catalog_name == printed:
        return True
    return catalog_name.rsplit(".", 1)[-1].strip('"') == printed.rsplit(".", 1)[-1].strip('"')
