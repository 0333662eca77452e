"""Table specs, the row-filter scan, and publications created and read back on a real server."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgpoll.errors import ConfigError, PrivilegeError, PublicationNotFoundError, SourceError
from pgpoll.source import publications as pubs
from pgpoll.source.connection import connect, resolve_dsn
from pgpoll.source.names import QualifiedName


def test_parse_table_spec_all_parts() -> None:
    spec = pubs.parse_table_spec('"My S".Orders ("Id", total) where (total > 10 AND note <> \'a;b\')')
    assert spec == pubs.TableSpec(QualifiedName("My S", "orders"), ("Id", "total"), "(total > 10 AND note <> 'a;b')")


def test_parse_table_spec_name_only_and_filter_only() -> None:
    assert pubs.parse_table_spec("t") == pubs.TableSpec(QualifiedName("public", "t"))
    assert pubs.parse_table_spec("t WHERE(id>1)").row_filter == "(id>1)"


@pytest.mark.parametrize(
    "expr",
    [
        "(a = 'x;y')",
        "(a = 'it''s -- not a comment')",
        '("we;ird" > 1)',
        "(a IN (1, 2, (3)))",
        "(a = '/* not a comment */')",
        "(a = U&'d!0061t' UESCAPE '!')",
    ],
)
def test_row_filter_scan_accepts_text_inside_literals(expr: str) -> None:
    assert pubs.parse_table_spec(f"t WHERE {expr}").row_filter == expr


@given(st.text(alphabet="();'\"-/*$\\ ab1E", max_size=30))
@settings(max_examples=400)
def test_row_filter_scan_never_accepts_a_semicolon_outside_literals(body: str) -> None:
    # Whatever is accepted, stripping every literal and quoted name leaves no ';',
    # comment start, '$' or backslash: exactly the scan's promise.
    try:
        spec = pubs.parse_table_spec(f"t WHERE ({body})")
    except ConfigError:
        return
    assert spec.row_filter is not None
    text, out, i = spec.row_filter, [], 0
    while i < len(text):
        if text[i] in "'\"":
            quote = text[i]
            i += 1
            while True:
                j = text.index(quote, i)
                if j + 1 < len(text) and text[j + 1] == quote:
                    i = j + 2
                    continue
                i = j + 1
                break
            continue
        out.append(text[i])
        i += 1
    bare = "".join(out)
    assert not any(token in bare for token in (";", "--", "/*", "$"))
    assert "\\" not in text


@pytest.fixture
def conn(db: Any) -> Any:
    connection = connect(resolve_dsn(db.dsn))
    yield connection
    connection.close()


def test_create_and_show_publication(db: Any, conn: Any) -> None:
    db.execute('CREATE TABLE t (id int PRIMARY KEY, "V" text, w int)')
    specs = [pubs.parse_table_spec('t (id, "V") WHERE (id > 1)')]
    pubs.create_publication(conn, "p1", tables=specs, publish=["insert", "update"])
    info = pubs.show_publication(conn, "p1")
    assert info == pubs.PublicationInfo(
        "p1", False, ("insert", "update"), False, (pubs.PublishedTable("public", "t", ("id", "V"), "(id > 1)"),)
    )
    assert info.as_json()["tables"] == [{"schema": "public", "table": "t", "columns": ["id", "V"], "row_filter": "(id > 1)"}]
    assert pubs.publication_exists(conn, "p1") and not pubs.publication_exists(conn, "P1")


def test_show_without_column_list_reports_none(db: Any, conn: Any) -> None:
    # pg_publication_tables.attnames lists all columns here; the column list itself is absent.
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pubs.create_publication(conn, "p", tables=[pubs.parse_table_spec("t")])
    assert db.execute("SELECT attnames::text[] FROM pg_publication_tables WHERE pubname = 'p'") == [(["id", "v"],)]
    assert pubs.show_publication(conn, "p").tables == (pubs.PublishedTable("public", "t", None, None),)


def test_drop_publication(db: Any, conn: Any) -> None:
    db.execute("CREATE PUBLICATION p FOR ALL TABLES")
    assert pubs.drop_publication(conn, "p") is True
    assert pubs.drop_publication(conn, "p", if_exists=True) is False
    with pytest.raises(PublicationNotFoundError):
        pubs.drop_publication(conn, "p")
    with pytest.raises(PublicationNotFoundError):
        pubs.show_publication(conn, "p")


def test_server_refusals_become_config_source_and_privilege_errors(db: Any, conn: Any) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(ConfigError) as bad_filter:
        pubs.create_publication(conn, "p", tables=[pubs.parse_table_spec("t WHERE (id)")])
    assert bad_filter.value.sqlstate == "42804"
    with pytest.raises(SourceError) as missing:
        pubs.create_publication(conn, "p", tables=[pubs.parse_table_spec("nope")])
    assert missing.value.sqlstate == "42P01"
    nobody = "p_nobody_" + db.name
    db.execute(f"CREATE ROLE {nobody}")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET ROLE {nobody}")
        with pytest.raises(PrivilegeError) as denied:
            pubs.create_publication(conn, "p", tables=[pubs.parse_table_spec("t")])
        assert denied.value.sqlstate == "42501"
    finally:
        with conn.cursor() as cur:
            cur.execute("RESET ROLE")
        db.execute(f"DROP ROLE {nobody}")
