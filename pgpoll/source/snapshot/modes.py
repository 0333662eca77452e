"""How a snapshot reads a table: one short snapshot per key-range chunk, or one shared snapshot. Pure.

Materialize has no database connection: it places each change's key in its
chunk by comparing it with the chunks' bounds in Spark, so a table can be
read in key-range chunks (each under its own short snapshot, mode
``chunked``) only when Spark orders every key column as PostgreSQL does:
integers, uuid and bytea always; text and varchar only under a code-point
collation ("C", "POSIX", or the builtin provider), where Spark's UTF-8 byte
order is PostgreSQL's. Every other table is read under one exported snapshot
(mode ``shared``): keyless tables (multisets), keys whose order only the
server knows (numeric, floats, text under ICU or libc locales), and every
table under ``--mode shared``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgpoll.typed.schemas import IDENTITY_FULL

CHUNKED, SHARED = "chunked", "shared"
#: ``--mode``: ``auto`` chooses per table (see the module docstring); ``shared`` reads every table under one snapshot.
AUTO = "auto"
MODES = (AUTO, SHARED)

#: Base types (pg_catalog typname) whose order Spark reproduces whatever the collation.
_ORDERED_TYPES = frozenset({"int2", "int4", "int8", "uuid", "bytea"})
#: Base types ordered by their collation: reproducible only under a code-point collation.
COLLATED_TYPES = frozenset({"text", "varchar"})


@dataclass(frozen=True)
class Collation:
    """A collation as the catalog describes it: provider (``c``, ``i``, ``b``, ``d`` = default) and locale."""

    provider: str
    collate: str | None


def code_point_ordered(collation: Collation, database: Collation) -> bool:
    """True when text under ``collation`` sorts by code point (= UTF-8 byte order, Spark's string order).

    ``C`` and ``POSIX`` under libc, and every builtin-provider locale (PG 17+:
    ``C``, ``C.UTF-8``, ``PG_UNICODE_FAST``); the default collation is the
    database's. Other libc locales (also ``C.UTF-8`` under libc) and ICU: no.
    """
    if collation.provider == "d":
        return code_point_ordered(database, database) if database.provider != "d" else False
    if collation.provider == "b":
        return True
    return collation.provider == "c" and collation.collate in ("C", "POSIX")


def key_order_reproducible(base_typname: str | None, collation: Collation | None, database: Collation) -> bool:
    """True when Spark orders values of this key column as PostgreSQL does (see the module docstring)."""
    if base_typname in _ORDERED_TYPES:
        return True
    if base_typname in COLLATED_TYPES and collation is not None:
        return code_point_ordered(collation, database)
    return False


def choose_mode(key: tuple[str, ...], identity: str, unordered: list[str], requested: str = AUTO) -> tuple[str, str]:
    """``(mode, why)`` of a table: its replica-identity ``key`` (``()``: none), ``identity`` (``pg_class.relreplident``),
    ``unordered`` the key columns whose order only the server knows (described for the message)."""
    if requested == SHARED:
        return SHARED, "--mode shared"
    if not key:
        if identity == IDENTITY_FULL:
            return SHARED, "no key (REPLICA IDENTITY FULL): read as a multiset under one snapshot"
        return SHARED, "no usable replica-identity key: read once as a multiset under one snapshot"
    if unordered:
        return SHARED, (f"key column {', '.join(unordered)}: only the server knows its order, so materialize cannot "
                        "place a key in its chunk")
    return CHUNKED, f"key ({', '.join(key)}) orders alike in PostgreSQL and Spark: one short snapshot per chunk"


__all__ = [
    "AUTO", "CHUNKED", "COLLATED_TYPES", "MODES", "SHARED", "Collation", "choose_mode", "code_point_ordered",
    "key_order_reproducible",
]
