"""The physical names of columns Delta forbids: reversible, one-to-one, recorded in the Delta schema (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given
from hypothesis import strategies as st

from pgpoll.materialize.delta.names import (
    FORBIDDEN,
    METADATA_KEY,
    arrow_names,
    decode,
    delta_schema_names,
    encode,
    encode_arrow_schema,
    field_metadata,
    logical_names,
    logical_table,
    needs_encoding,
    physical_names,
)
from pgpoll.sink.delta_read import read_delta

HOSTILE = ["a b", "x,y", "semi;colon", "{brace}", "f(x)", "k=v", "tab\there", "new\nline", "pct%", "a%20b", "Ä ö"]


def test_each_forbidden_character_and_the_escape_become_percent_hex() -> None:
    assert encode("a b") == "a%20b"
    assert encode(" ,;{}()=\t\n%") == "%20%2C%3B%7B%7D%28%29%3D%09%0A%25"
    assert encode("Ä ö") == "Ä%20ö"  # other characters, non-ASCII too, stay as they are
    assert not any(ch in FORBIDDEN for name in HOSTILE for ch in encode(name))


def test_names_delta_accepts_are_unchanged_and_carry_no_metadata() -> None:
    for name in ["id", "_op", "A", "a", "we.ird/t[1]", "_commit_lsn__2", "ünï"]:
        assert not needs_encoding(name)
        assert encode(name) == name and field_metadata(name) == {}
    assert field_metadata("a b") == {METADATA_KEY: "a b"}


def test_a_real_column_named_like_an_encoded_one_gets_its_own_physical_name() -> None:
    names = physical_names(["a b", "a%20b", "A B"])
    assert names == {"a b": "a%20b", "a%20b": "a%2520b", "A B": "A%20B"}
    assert len(set(names.values())) == 3
    with pytest.raises(ValueError, match="both be stored"):
        physical_names(["a b", "a b"])


def test_decode_undoes_encode_and_refuses_a_broken_escape() -> None:
    for name in HOSTILE:
        assert decode(encode(name)) == name
    for bad in ["a%2", "a%zz", "%"]:
        with pytest.raises(ValueError, match="two hex digits"):
            decode(bad)


@given(st.lists(st.text(alphabet=st.sampled_from(sorted(FORBIDDEN | {"%", "a", "A", "2", "0", "_", "é"})),
                        min_size=1, max_size=8), unique=True, max_size=6))
def test_the_encoding_is_one_to_one_and_keeps_case_relations(names: list[str]) -> None:
    physical = physical_names(names)
    assert len(set(physical.values())) == len(names)
    assert all(decode(p) == n for n, p in physical.items())
    for a in names:
        for b in names:
            assert (a.lower() == b.lower()) == (physical[a].lower() == physical[b].lower())


def test_the_mapping_is_read_back_from_field_metadata_and_other_fields_keep_their_names() -> None:
    found = logical_names([("a%20b", {METADATA_KEY: "a b"}), ("pct%", None), ("id", {"comment": "x"})])
    assert found == {"a%20b": "a b", "pct%": "pct%", "id": "id"}  # "pct%": written by another tool
    schema_json = ('{"type":"struct","fields":[{"name":"k%3Dv","type":"long","nullable":true,'
                   '"metadata":{"pgpoll.name":"k=v"}},{"name":"id","type":"long","nullable":true,"metadata":{}}]}')
    assert delta_schema_names(schema_json) == {"k%3Dv": "k=v", "id": "id"}


def test_a_delta_table_written_with_the_encoded_schema_reads_back_under_the_postgresql_names(tmp_path: Path) -> None:
    names = ["id", *HOSTILE]
    source = pa.table({n: [i, None] for i, n in enumerate(names)})
    schema = encode_arrow_schema(source.schema)
    assert schema.names == [encode(n) for n in names]
    write_deltalake(str(tmp_path / "t"), pa.Table.from_arrays(source.columns, schema=schema))
    table = DeltaTable(str(tmp_path / "t"))
    fields = [f.name for f in table.schema().fields]
    assert fields == [encode(n) for n in names] and not any(ch in FORBIDDEN for f in fields for ch in f)
    assert delta_schema_names(table.schema().to_json()) == {encode(n): n for n in names}
    read = read_delta(str(tmp_path / "t"))
    assert arrow_names(read.schema) == {encode(n): n for n in names}
    assert logical_table(read).to_pylist() == source.to_pylist()
