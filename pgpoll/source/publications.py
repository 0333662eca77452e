"""Publications: create, drop and show, with column lists and row filters.

A table is given as ``schema.tbl [(col, ...)] [WHERE (expr)]``. Names are
parsed and re-quoted; the row filter is user SQL by nature, so it is checked
to be exactly one parenthesised expression (balanced parentheses; no ``;``,
comments or dollar quotes outside string literals; no backslash at all) before
it reaches the server, which then applies its own rules for row filters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2 import sql

from pgpoll.errors import ConfigError, PrivilegeError, PublicationNotFoundError
from pgpoll.source.names import QualifiedName, check_identifier, parse_column_list, parse_qualified_name
from pgpoll.source.publication_identity import IdentityProblem, identity_problems
from pgpoll.source.server_errors import translate

PUBLISH_ACTIONS = ("insert", "update", "delete", "truncate")


@dataclass(frozen=True)
class TableSpec:
    """One ``--table`` argument, parsed."""

    name: QualifiedName
    columns: tuple[str, ...] | None = None
    row_filter: str | None = None

    def sql(self) -> sql.Composable:
        """``TABLE "s"."t" ("a", "b") WHERE (expr)`` as SQL."""
        parts: list[sql.Composable] = [sql.SQL("TABLE "), self.name.sql()]
        if self.columns:
            parts.append(sql.SQL(" ({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)))
        if self.row_filter:
            parts.append(sql.SQL(" WHERE ") + sql.SQL(self.row_filter))
        return sql.Composed(parts)


def _check_expression(expr: str, spec: str) -> str:
    """``expr`` must be one balanced ``( ... )`` that cannot end the statement.

    The text is scanned as PostgreSQL's lexer would, for the parts that can hide
    a statement break: string literals (``'...'`` with ``''``), quoted names
    (``"..."`` with ``""``), comments and dollar quotes. A backslash is refused
    anywhere: it is what makes ``E'...'`` strings end somewhere else than plain
    ones, and without it every literal ends at the same quote for the server and
    for this scan. So a ``;`` the scan does not see cannot exist, and the
    statement sent is exactly one ``CREATE PUBLICATION``.
    """
    fix = "a row filter is one expression in parentheses: comparisons, AND/OR/NOT, IS NULL, IN, constants"
    if not expr.startswith("("):
        raise ConfigError(f"row filter in {spec!r} must be in parentheses", "write: --table 'schema.tbl WHERE (expr)'")
    if "\\" in expr:
        raise ConfigError(
            f"row filter of {spec!r} contains a backslash",
            "backslashes are not accepted in a row filter; write the character as chr(92) || '...'",
        )
    depth = 0
    i = 0
    n = len(expr)
    while i < n:
        ch = expr[i]
        if ch in ("'", '"'):
            j = i + 1
            while True:
                j = expr.find(ch, j)
                if j < 0:
                    raise ConfigError(f"unterminated {ch} in row filter of {spec!r}", "close every quote")
                if j + 1 < n and expr[j + 1] == ch:
                    j += 2
                    continue
                break
            i = j + 1
            continue
        if ch in ";$" or expr.startswith("--", i) or expr.startswith("/*", i):
            what = expr[i : i + 2] if ch in "-/" else ch
            raise ConfigError(f"row filter of {spec!r} contains {what!r} outside a string literal", fix)
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and expr[i + 1 :].strip():
                raise ConfigError(
                    f"unexpected text after the row filter in {spec!r}: {expr[i + 1:].strip()!r}",
                    "write: --table 'schema.tbl [(col, ...)] [WHERE (expr)]'",
                )
        i += 1
    if depth != 0:
        raise ConfigError(f"unbalanced parentheses in row filter of {spec!r}", "close every (")
    return expr.strip()


def parse_table_spec(spec: str) -> TableSpec:
    """Parse ``schema.tbl [(col, ...)] [WHERE (expr)]``."""
    name, pos = parse_qualified_name(spec)
    while pos < len(spec) and spec[pos].isspace():
        pos += 1
    columns: tuple[str, ...] | None = None
    if spec.startswith("(", pos):
        cols, pos = parse_column_list(spec, pos)
        columns = tuple(cols)
    rest = spec[pos:].strip()
    row_filter: str | None = None
    if rest:
        m = re.match(r"(?i)where\s*", rest)
        if not m:
            raise ConfigError(
                f"unexpected {rest!r} in table {spec!r}", "write: --table 'schema.tbl [(col, ...)] [WHERE (expr)]'"
            )
        row_filter = _check_expression(rest[m.end() :].strip(), spec)
    return TableSpec(name, columns, row_filter)


@dataclass(frozen=True)
class CreatedPublication:
    """What :func:`create_publication` did."""

    name: str
    identity_full: tuple[str, ...] = ()
    """Tables set to REPLICA IDENTITY FULL (``replica_identity_full=True``), ``schema.table``."""


@contextmanager
def _transaction(conn: Any) -> Iterator[Any]:
    """One transaction on ``conn`` (committed on success, rolled back on any error), then its autocommit back."""
    autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = autocommit


def create_publication(
    conn: Any,
    name: str,
    *,
    all_tables: bool = False,
    tables: list[TableSpec] | None = None,
    publish: list[str] | None = None,
    via_partition_root: bool = False,
    replica_identity_full: bool = False,
) -> CreatedPublication:
    """CREATE PUBLICATION with quoted names; exactly one of ``all_tables``/``tables``.

    Refused with :class:`ConfigError`, and nothing created, when a table's UPDATE
    or DELETE would then fail on the source (:mod:`pgpoll.source.publication_identity`).
    With ``replica_identity_full`` the tables that REPLICA IDENTITY FULL fixes are
    altered in the same transaction (a change to the source tables: their UPDATE
    and DELETE then log the whole old row).
    """
    check_identifier(name, "publication name")
    if all_tables == bool(tables):
        raise ConfigError("give either --all-tables or one or more --table", "e.g. --table public.orders")
    query: sql.Composable = sql.SQL("CREATE PUBLICATION {} ").format(sql.Identifier(name))
    if all_tables:
        query += sql.SQL("FOR ALL TABLES")
    else:
        query += sql.SQL("FOR ") + sql.SQL(", ").join(t.sql() for t in tables or [])
    with_opts: list[sql.Composable] = []
    if publish is not None:
        bad = [p for p in publish if p not in PUBLISH_ACTIONS]
        if bad or not publish:
            raise ConfigError(f"unknown --publish action(s) {bad or publish}",
                              "use a comma list of insert,update,delete,truncate")
        with_opts.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(publish))))
    if via_partition_root:
        with_opts.append(sql.SQL("publish_via_partition_root = true"))
    if with_opts:
        query += sql.SQL(" WITH (") + sql.SQL(", ").join(with_opts) + sql.SQL(")")
    try:
        with _transaction(conn) as cur:
            cur.execute(query)
            problems = identity_problems(cur, name)
            altered: list[str] = []
            if problems and replica_identity_full:
                for problem in problems:
                    if problem.full_fixes and problem.table not in altered:
                        cur.execute(sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                            sql.Identifier(problem.relation[0]), sql.Identifier(problem.relation[1])))
                        altered.append(problem.table)
                problems = identity_problems(cur, name)
            if problems:
                raise _refusal(name, problems)
    except psycopg2.Error as exc:
        if exc.pgcode in _BAD_DEFINITION:
            detail = getattr(exc.diag, "message_detail", None)
            raise ConfigError(
                f"PostgreSQL refused the publication: {exc.diag.message_primary}" + (f" ({detail})" if detail else ""),
                "a row filter may use only the table's columns, constants, built-in immutable operators and functions",
                sqlstate=exc.pgcode,
            ) from None
        if exc.pgcode == "42501":
            raise PrivilegeError(
                f"cannot create publication {name}: {exc.diag.message_primary}",
                "publications are created by the tables' owner holding CREATE on the database "
                "(FOR ALL TABLES: a superuser); see sql/least_privilege.sql",
                sqlstate=exc.pgcode,
            ) from None
        raise translate(exc) from None
    return CreatedPublication(name, tuple(altered))


def _refusal(name: str, problems: list[IdentityProblem]) -> ConfigError:
    first = problems[0]
    others = sorted({p.table for p in problems[1:]} - {first.table})
    more = f" (and {len(others)} more: {', '.join(others[:5])}{', ...' if len(others) > 5 else ''})" if others else ""
    return ConfigError(
        f"publication {name} not created: {first.message()}{more}",
        first.fix(name, for_create=True),
        relation=first.table,
    )


# A publication definition PostgreSQL refuses as written: syntax error, feature
# not allowed in a row filter, wrong type, unknown function or operator.
_BAD_DEFINITION = frozenset({"42601", "0A000", "42804", "42883", "42P18", "22P02"})


def drop_publication(conn: Any, name: str, *, if_exists: bool = False) -> bool:
    """DROP PUBLICATION; returns False when absent and ``if_exists``."""
    check_identifier(name, "publication name")
    if not publication_exists(conn, name):
        if if_exists:
            return False
        raise PublicationNotFoundError(f'publication "{name}" does not exist',
                                       "check the name with: pgpoll publication show NAME")
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
    except psycopg2.Error as exc:
        raise translate(exc) from None
    return True


def publication_exists(conn: Any, name: str) -> bool:
    """True when the publication exists in the connected database."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
            return cur.fetchone() is not None
    except psycopg2.Error as exc:
        raise translate(exc) from None


@dataclass(frozen=True)
class PublishedTable:
    """A table of a publication as PostgreSQL reports it."""

    schema: str
    table: str
    columns: tuple[str, ...] | None
    row_filter: str | None


@dataclass(frozen=True)
class PublicationInfo:
    """A publication and its tables."""

    name: str
    all_tables: bool
    publish: tuple[str, ...]
    via_partition_root: bool
    tables: tuple[PublishedTable, ...]

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "publication": self.name,
            "all_tables": self.all_tables,
            "publish": list(self.publish),
            "via_partition_root": self.via_partition_root,
            "tables": [
                {"schema": t.schema, "table": t.table, "columns": list(t.columns) if t.columns else None,
                 "row_filter": t.row_filter}
                for t in self.tables
            ],
        }


_TABLES_QUERY = """
SELECT pt.schemaname, pt.tablename, pt.attnames::text[], pt.rowfilter, pr.prattrs IS NOT NULL
FROM pg_publication_tables pt
JOIN pg_publication p ON p.pubname = pt.pubname
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
LEFT JOIN pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = c.oid
WHERE pt.pubname = %s
ORDER BY pt.schemaname, pt.tablename
"""


def show_publication(conn: Any, name: str) -> PublicationInfo:
    """The publication, its actions and each table's column list and row filter."""
    check_identifier(name, "publication name")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot "
                "FROM pg_publication WHERE pubname = %s",
                (name,),
            )
            row = cur.fetchone()
            if row is not None:
                # pg_publication_tables.attnames lists every column when the table has no
                # column list; pg_publication_rel.prattrs is NULL then (and there is no
                # pg_publication_rel row at all for FOR ALL TABLES).
                cur.execute(_TABLES_QUERY, (name,))
                table_rows = cur.fetchall()
    except psycopg2.Error as exc:
        raise translate(exc) from None
    if row is None:
        raise PublicationNotFoundError(
            f'publication "{name}" does not exist', "create it: pgpoll publication create NAME --table schema.tbl"
        )
    publish = tuple(a for a, on in zip(PUBLISH_ACTIONS, row[1:5], strict=True) if on)
    tables = [
        PublishedTable(schema, table, tuple(attnames) if has_list else None, rowfilter)
        for schema, table, attnames, rowfilter, has_list in table_rows
    ]
    return PublicationInfo(name, bool(row[0]), publish, bool(row[5]), tuple(tables))
