"""``pgpoll decode``: peek lines captured from a real server decode to the same changes from both plugins."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli


def _peek_json(db: Any, slot: str, *extra: str) -> str:
    result = CliRunner().invoke(cli, ["slot", "peek", slot, "--json", *extra], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0, result.output
    return result.stdout


def _decode(plugin: str, text: str) -> Any:
    return CliRunner().invoke(cli, ["decode", "--plugin", plugin, "-"], input=text)


def test_both_plugins_decode_a_workload_to_the_same_changes(db: Any) -> None:
    db.require_plugin("test_decoding")
    db.execute('CREATE TABLE "Odd ""name"" t" (id int PRIMARY KEY, "v a" text, n numeric, b bytea, ts timestamptz, ok boolean, flags boolean[])')
    db.execute('CREATE PUBLICATION pub FOR TABLE "Odd ""name"" t"')
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot('dec_td', 'test_decoding')")
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot('dec_po', 'pgoutput')")
    db.execute(
        'INSERT INTO "Odd ""name"" t" VALUES '
        "(1, $$it's\nmulti$$, 'NaN', '\\x00ff', '2026-01-02 03:04:05+02', true, '{t,f,NULL}'), "
        "(2, NULL, 1.50, NULL, NULL, false, NULL)"
    )
    db.execute('UPDATE "Odd ""name"" t" SET n = \'Infinity\' WHERE id = 2')
    db.execute('DELETE FROM "Odd ""name"" t" WHERE id = 1')

    td = _decode("test_decoding", _peek_json(db, "dec_td"))
    po = _decode("pgoutput", _peek_json(db, "dec_po", "--publication", "pub"))

    assert td.exit_code == 0 and po.exit_code == 0, (td.stderr, po.stderr)
    td_rows = [json.loads(line) for line in td.stdout.splitlines()]
    po_rows = [json.loads(line) for line in po.stdout.splitlines()]
    assert [r["op"] for r in td_rows] == ["I", "I", "U", "D"]
    for a, b in zip(td_rows, po_rows, strict=True):
        for key in ("commit_lsn", "lsn", "seq", "xid", "commit_ts", "op", "schema_name", "table_name", "after", "before"):
            assert a[key] == b[key], (key, a, b)
    assert td_rows[0]["table_name"] == 'Odd "name" t'
    assert td_rows[0]["after"] == {
        "id": "1", "v a": "it's\nmulti", "n": "NaN", "b": "\\x00ff", "ts": "2026-01-02 01:04:05+00",
        "ok": "true", "flags": "{t,f,NULL}",
    }
    assert td_rows[1]["after"]["ok"] == "false"
    # the text form is what PostgreSQL itself prints for the stored values
    assert db.execute('SELECT ok::text, flags::text FROM "Odd ""name"" t" WHERE id = 2') == [("false", None)]
    assert td_rows[3]["before"] == {"id": "1"}


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("not json\n", "row 1 is not JSON"),
        ('{"lsn": "0/1"}\n', "neither data nor data_hex"),
        ('{"data": "table public.t: FROB: x"}\n', "row 1"),
    ],
)
def test_bad_rows_are_named_and_exit_6(text: str, complaint: str) -> None:
    result = _decode("test_decoding", text)
    assert result.exit_code == 6
    assert complaint in result.stderr
    assert "could not be decoded" in result.stderr


def test_rows_outside_a_transaction_get_null_transaction_fields() -> None:
    result = _decode("test_decoding", '{"data": "table public.t: INSERT: id[integer]:5"}\n')
    assert result.exit_code == 0
    row = json.loads(result.stdout)
    assert row["commit_lsn"] is None and row["xid"] is None and row["after"] == {"id": "5"}


def test_pgoutput_rows_must_be_hex() -> None:
    result = _decode("pgoutput", '{"data": "BEGIN 1"}\n')
    assert result.exit_code == 6 and "pgoutput rows are binary" in result.stderr
