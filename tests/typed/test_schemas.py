"""Table shapes without a server: content-hash ids, JSON, and building them from each plugin's description."""

from __future__ import annotations

from types import SimpleNamespace

from pgpoll.typed.mapping import PgType, type_from_name
from pgpoll.typed.schemas import (
    IDENTITY_DEFAULT,
    IDENTITY_FULL,
    CatalogTable,
    ColumnSchema,
    TableSchema,
    schema_from_columns,
    schema_from_relation,
)


def _t(*columns: tuple[str, str], key: tuple[str, ...] = ("id",), identity: str | None = "d", partial: bool = False,
       table: str = "t") -> TableSchema:
    cols = tuple(ColumnSchema(n, type_from_name(ty)) for n, ty in columns)
    return TableSchema("public", table, cols, key, identity, partial)


BASE = (("id", "integer"), ("v", "text"))


def test_schema_id_is_stable_for_equal_content() -> None:
    a, b = _t(*BASE), _t(*BASE)
    assert a is not b and a.schema_id == b.schema_id and a == b
    assert len(a.schema_id) == 20 and int(a.schema_id, 16) >= 0


def test_schema_id_differs_when_types_key_identity_or_shape_differ() -> None:
    base = _t(*BASE)
    others = [
        _t(("id", "bigint"), ("v", "text")),  # a type
        _t(("id", "integer"), ("v", "character varying(10)")),  # a typmod
        _t(*BASE, key=()),  # the key
        _t(*BASE, key=("id", "v")),
        _t(*BASE, identity="f"),  # the identity
        _t(*BASE, identity=None),
        _t(*BASE, partial=True),
        _t(("v", "text"), ("id", "integer")),  # column order
        _t(*BASE, table="u"),  # another table
    ]
    ids = [base.schema_id] + [o.schema_id for o in others]
    assert len(set(ids)) == len(ids)


def test_json_round_trip_keeps_content_and_id() -> None:
    t = TableSchema(
        "My Schema", "we.ird",
        (ColumnSchema("id", type_from_name("bigint")), ColumnSchema("n", type_from_name("numeric(10,2)")),
         ColumnSchema("xs", type_from_name("integer[]")), ColumnSchema("e", PgType("exact", '"My Schema".mood'))),
        ("id",), IDENTITY_DEFAULT, False,
    )
    back = TableSchema.from_json(t.to_json())
    assert back == t and back.schema_id == t.schema_id
    assert back.column("n") == ColumnSchema("n", PgType("numeric", "numeric(10,2)", 10, 2))
    assert back.qualified_name == "My Schema.we.ird" and back.names == ("id", "n", "xs", "e")
    assert TableSchema.from_json(_t(*BASE, partial=True).to_json()).partial


def test_schema_from_columns_takes_the_catalogs_full_type_only_when_the_printed_type_matches() -> None:
    catalog = CatalogTable(IDENTITY_DEFAULT, ("id",), {
        "id": ("integer", "integer"),
        "n": ("numeric", "numeric(10,2)"),
        "m": ("numeric", "numeric(8,3)"),  # the column has since changed type in the catalog's view
        "d": ("public.positive", "integer"),  # a domain: format_type schema-qualifies it, the stream may not
    })
    s = schema_from_columns("public", "t", [("id", "integer"), ("n", "numeric"), ("m", "text"), ("d", "positive")],
                            catalog)
    assert s.column("n") == ColumnSchema("n", PgType("numeric", "numeric(10,2)", 10, 2))
    assert s.column("m") == ColumnSchema("m", PgType("text", "text"))
    assert s.column("d") == ColumnSchema("d", PgType("int4", "integer"))
    assert s.key == ("id",) and s.identity == "d" and not s.partial
    # without a catalog: the printed types as they are, no key
    bare = schema_from_columns("public", "t", [("id", "integer"), ("n", "numeric"), ("u", None)], None)
    assert bare.column("n") == ColumnSchema("n", PgType("numeric", "numeric")) and bare.key == ()
    assert bare.column("u") == ColumnSchema("u", PgType("text", "text")) and bare.identity is None


def test_full_identity_makes_every_column_key() -> None:
    catalog = CatalogTable(IDENTITY_FULL, ())
    s = schema_from_columns("public", "t", [("a", "integer"), ("b", "text"), ("c", "date")], catalog)
    assert s.key == ("a", "b", "c") and s.identity == "f"


def test_partial_delete_shapes_keep_the_catalog_key() -> None:
    catalog = CatalogTable(IDENTITY_DEFAULT, ("id", "region"))
    # a DELETE's old key printed only one key column (a case test_decoding can produce with a NULL key part)
    partial = schema_from_columns("public", "t", [("id", "integer")], catalog, partial=True)
    assert partial.partial and partial.key == ("id", "region")
    # a full row keeps only the key columns it has
    whole = schema_from_columns("public", "t", [("id", "integer"), ("v", "text")], catalog)
    assert whole.key == ("id",) and not whole.partial
    assert partial.schema_id != schema_from_columns("public", "t", [("id", "integer")], catalog).schema_id


def test_schema_from_relation_reads_types_keys_and_identity() -> None:
    numeric_10_2 = ((10 << 16) | 2) + 4
    rel = SimpleNamespace(
        schema="public", table="acct", replica_identity="d",
        columns=(
            SimpleNamespace(name="id", type_oid=20, type_modifier=-1, is_key=True),
            SimpleNamespace(name="balance", type_oid=1700, type_modifier=numeric_10_2, is_key=False),
            SimpleNamespace(name="mood", type_oid=50001, type_modifier=-1, is_key=False),
        ),
    )
    s = schema_from_relation(rel, {50001: ("public", "mood")})
    assert s.names == ("id", "balance", "mood") and s.key == ("id",) and s.identity == "d"
    assert s.column("balance") == ColumnSchema("balance", PgType("numeric", "numeric(10,2)", 10, 2))
    assert s.column("mood") == ColumnSchema("mood", PgType("exact", "public.mood"))
    odd = schema_from_relation(SimpleNamespace(schema="s", table="t", replica_identity="?", columns=()), {})
    assert odd.identity is None and odd.columns == ()
