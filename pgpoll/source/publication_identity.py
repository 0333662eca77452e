"""Which tables of a publication would make the source's own UPDATE and DELETE fail.

When a publication publishes UPDATE or DELETE, PostgreSQL checks every UPDATE
and DELETE on its tables (``CheckCmdReplicaIdentity`` in ``execReplication.c``)
and refuses the application's statement, not the capture, when:

- the table has no usable replica identity: no primary key under REPLICA
  IDENTITY DEFAULT, REPLICA IDENTITY NOTHING, or USING INDEX whose index is gone
  ("cannot update table ... because it does not have a replica identity and
  publishes updates");
- the publication's column list does not cover the replica identity. Under
  REPLICA IDENTITY FULL no column list covers it, not even one naming every
  column (seen on PostgreSQL 15 to 18);
- the row filter reads a column outside the replica identity ("Column used in
  the publication WHERE expression is not part of the replica identity").

A capture tool must never break the source's writes, so ``pgpoll publication
create`` refuses such a publication (inside the transaction that created it, so
nothing is left behind) and ``pgpoll check --publication`` reports it. The
tables are read from ``pg_get_publication_tables`` (what the server itself
publishes: FOR ALL TABLES, schemas, partitions with or without
``publish_via_partition_root``), and a partitioned table is checked through its
leaf partitions, which are what UPDATE and DELETE modify. Column lists and
filters belong to the published relation and are matched to a partition's
columns by name, as PostgreSQL does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pgpoll.source.names import quote_ident

NO_IDENTITY, COLUMN_LIST, ROW_FILTER = "no replica identity", "column list", "row filter"

# pg_get_publication_tables: what the server publishes (FOR ALL TABLES, schemas, partitions by
# publish_via_partition_root), by OID; the column list and filter are the published relation's.
# The planner estimates 1000 rows per set-returning function, which puts this small catalog query
# far above jit_above_cost: JIT compilation alone took seconds. set_config(..., true) in the same
# simple-query message is local to its implicit transaction (or the caller's), and planning of the
# SELECT happens after it runs.
_PROBLEM_TABLES = """
SELECT set_config('jit', 'off', true);
SELECT pn.nspname, pc.relname, ln.nspname, lc.relname, lc.relreplident,
       p.pubupdate, p.pubdelete, pr.prattrs IS NOT NULL,
       (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = pc.oid AND a.attnum = ANY (pr.prattrs::int2[]))::text[],
       pr.prqual::text,
       (SELECT array_agg(a.attnum ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = pc.oid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = pc.oid AND a.attnum > 0 AND NOT a.attisdropped)::text[],
       (SELECT array_agg(a.attname ORDER BY k.ord)
          FROM pg_index i
          CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         WHERE i.indrelid = lc.oid
           AND ((lc.relreplident = 'd' AND i.indisprimary) OR (lc.relreplident = 'i' AND i.indisreplident)))::text[]
FROM pg_publication p
CROSS JOIN LATERAL pg_get_publication_tables(p.pubname::text) gpt
JOIN pg_class pc ON pc.oid = gpt.relid
JOIN pg_namespace pn ON pn.oid = pc.relnamespace
LEFT JOIN pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = pc.oid
CROSS JOIN LATERAL (
    SELECT pc.oid AS relid WHERE pc.relkind <> 'p'
    UNION ALL
    SELECT t.relid FROM pg_partition_tree(pc.oid) t WHERE pc.relkind = 'p' AND t.isleaf
) leaf
JOIN pg_class lc ON lc.oid = leaf.relid AND lc.relkind = 'r'
JOIN pg_namespace ln ON ln.oid = lc.relnamespace
WHERE p.pubname = %s AND (p.pubupdate OR p.pubdelete)
ORDER BY 3, 4, 1, 2
"""

_IDENTITY_NAMES = {"d": "DEFAULT", "i": "USING INDEX", "n": "NOTHING", "f": "FULL"}


@dataclass(frozen=True)
class IdentityProblem:
    """One table whose UPDATE or DELETE the publication would make fail on the source."""

    table: str
    """The table modified (a partition when a partitioned table is published), ``schema.table`` as shown."""
    kind: str
    """:data:`NO_IDENTITY`, :data:`COLUMN_LIST` or :data:`ROW_FILTER`."""
    detail: str
    """What is wrong, in a few words."""
    statements: str
    """``UPDATE``, ``DELETE`` or ``UPDATE and DELETE``: what would fail."""
    relation: tuple[str, str]
    """(schema, table) of :attr:`table`, unquoted."""
    has_column_list: bool
    published_as: str
    """The published relation, when it is not :attr:`table` (a partitioned table)."""
    remedy: str = ""
    """For a column list: the change to the list (or table) that covers the identity."""

    @property
    def quoted(self) -> str:
        """The table as SQL (quoted names)."""
        return f"{quote_ident(self.relation[0])}.{quote_ident(self.relation[1])}"

    @property
    def full_fixes(self) -> bool:
        """True when REPLICA IDENTITY FULL on :attr:`table` removes the problem (never with a column list)."""
        return self.kind in (NO_IDENTITY, ROW_FILTER) and not self.has_column_list

    def message(self) -> str:
        """One line: the table, what is wrong and what would fail."""
        via = f" (published as {self.published_as})" if self.published_as != self.table else ""
        return f"{self.table}{via}: {self.detail}; its {self.statements} would fail on the source"

    def fix(self, publication: str, *, for_create: bool) -> str:
        """How to fix it: for ``publication create`` (its options) or for an existing publication (SQL)."""
        insert_only = ("--publish insert,truncate" if for_create
                       else f"ALTER PUBLICATION {quote_ident(publication)} SET (publish = 'insert, truncate')")
        full = ("--replica-identity-full (sets REPLICA IDENTITY FULL on the table)" if for_create
                else f"ALTER TABLE {self.quoted} REPLICA IDENTITY FULL")
        if self.kind == NO_IDENTITY:
            first = f"add a primary key to {self.table}"
            if self.full_fixes:
                return f"{first}, or {full}, or {insert_only}"
            return f"{first} (and to the column list), or {insert_only}"
        if self.kind == COLUMN_LIST:
            return f"{self.remedy}, or {insert_only}"
        return (f"filter on replica identity columns only, or {full}, or {insert_only}" if self.full_fixes
                else f"filter on replica identity columns only, or {insert_only}")


def identity_problems(cur: Any, publication: str) -> list[IdentityProblem]:
    """The tables of ``publication`` (which must exist) whose UPDATE or DELETE would fail on the source."""
    cur.execute(_PROBLEM_TABLES, (publication,))
    problems: list[IdentityProblem] = []
    for row in cur.fetchall():
        problem = _problem(*row)
        if problem is not None:
            problems.append(problem)
    return problems


def _problem(pub_schema: str, pub_table: str, schema: str, table: str, identity: str, update: bool, delete: bool,
             has_list: bool, list_names: list[str] | None, qual: str | None, attnums: list[int] | None,
             attnames: list[str] | None, key: list[str] | None) -> IdentityProblem | None:
    statements = " and ".join(s for s, on in (("UPDATE", update), ("DELETE", delete)) if on)
    shown, published = f"{schema}.{table}", f"{pub_schema}.{pub_table}"
    quoted = f"{quote_ident(schema)}.{quote_ident(table)}"

    def problem(kind: str, detail: str, remedy: str = "") -> IdentityProblem:
        return IdentityProblem(shown, kind, detail, statements, (schema, table), has_list, published, remedy)

    key_columns = list(key or [])
    if identity != "f" and not key_columns:
        detail = {
            "d": "it has no primary key (REPLICA IDENTITY DEFAULT)",
            "n": "its REPLICA IDENTITY is NOTHING",
            "i": "its replica identity index no longer exists",
        }.get(identity, f"it has no usable replica identity ({identity})")
        return problem(NO_IDENTITY, detail)
    if has_list:
        if identity == "f":
            return problem(COLUMN_LIST, "it is REPLICA IDENTITY FULL, which no column list covers",
                           f"drop the column list, or give {shown} a primary key inside the list and "
                           f"ALTER TABLE {quoted} REPLICA IDENTITY DEFAULT")
        listed = set(list_names or [])
        missing = [k for k in key_columns if k not in listed]
        if missing:
            return problem(COLUMN_LIST, f"the column list ({', '.join(list_names or [])}) does not cover the replica "
                                        f"identity ({', '.join(key_columns)})",
                           f"add {', '.join(missing)} to the column list")
    if qual and identity != "f":
        by_num = dict(zip(attnums or [], attnames or [], strict=True))
        used = {by_num.get(int(n), f"#{n}") for n in re.findall(r":varattno (\d+)", qual)}
        outside = sorted(used - set(key_columns))
        if outside:
            what = f"REPLICA IDENTITY {_IDENTITY_NAMES.get(identity, identity)}: {', '.join(key_columns)}"
            return problem(ROW_FILTER, f"the row filter uses {', '.join(outside)}, outside the replica identity ({what})")
    return None
