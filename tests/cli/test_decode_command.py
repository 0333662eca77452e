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
    db.execute('CREATE TABLE "Odd ""name"" t" '
               '(id int PRIMARY KEY, "v a" text, n numeric, b bytea, ts timestamptz, ok boolean, flags boolean[])')
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


def _decode_args(*args: str, text: str) -> Any:
    return CliRunner().invoke(cli, ["decode", *args, "-"], input=text)


@pytest.mark.parametrize("plugin", ["test_decoding", "pgoutput"])
def test_an_unfinished_transaction_at_the_end_is_reported_and_printed_with_partial(db: Any, plugin: str) -> None:
    if plugin == "test_decoding":
        db.require_plugin("test_decoding")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    db.execute("INSERT INTO t VALUES (1, 'committed')")
    db.execute("BEGIN; INSERT INTO t VALUES (2, 'a'), (3, 'b'), (4, 'c'); COMMIT")
    extra = ("--publication", "pub") if plugin == "pgoutput" else ()
    whole = _peek_json(db, slot, *extra)
    # stop after the second row of the three-row transaction (pgoutput also sends a Relation message, once)
    lines = whole.splitlines()
    begins = [i for i, line in enumerate(lines) if _is_begin(plugin, line)]
    cut = "\n".join(lines[: begins[1] + 3]) + "\n"

    complete = _decode_args("--plugin", plugin, text=whole)
    assert complete.exit_code == 0 and complete.stderr == ""
    assert len(complete.stdout.splitlines()) == 4

    result = _decode_args("--plugin", plugin, text=cut)
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["after"]["id"] for line in result.stdout.splitlines()] == ["1"]
    assert result.stderr == ("the input ends inside 1 unfinished transaction(s): 2 change(s) not printed "
                             "(--partial prints them)\n")

    partial = _decode_args("--plugin", plugin, "--partial", text=cut)
    assert partial.exit_code == 0, partial.stderr
    rows = [json.loads(line) for line in partial.stdout.splitlines()]
    assert [(r["after"]["id"], r.get("partial")) for r in rows] == [("1", None), ("2", True), ("3", True)]
    committed = json.loads(complete.stdout.splitlines()[1])
    assert rows[1]["commit_lsn"] is None and rows[1]["xid"] == committed["xid"]
    assert [r["seq"] for r in rows[1:]] == [0, 1]
    assert partial.stderr == 'the input ends inside 1 unfinished transaction(s): printed their 2 change(s) with "partial": true\n'


def _is_begin(plugin: str, line: str) -> bool:
    row = json.loads(line)
    if plugin == "pgoutput":
        return bytes.fromhex(row["data_hex"])[:1] == b"B"
    return str(row["data"]).startswith("BEGIN")


def test_open_streamed_and_prepared_transactions_count_too() -> None:
    """Events as the pgoutput decoder yields them: a stream left open, one with an aborted subtransaction,
    one committed; a prepared transaction without COMMIT PREPARED; one prepared and committed."""
    from pgpoll.changes import (
        Begin,
        Commit,
        CommitPrepared,
        Op,
        Prepare,
        RowChange,
        StreamAbort,
        StreamCommit,
        StreamStart,
        StreamStop,
    )
    from pgpoll.cli.decode_command import _Unfinished
    from pgpoll.decode.assembler import TransactionAssembler

    def row(xid: int, key: int) -> RowChange:
        return RowChange(Op.INSERT, "public", "t", (), None, {"id": str(key)}, xid=xid, lsn=key)

    events = [
        StreamStart(xid=10), row(10, 1), row(11, 2), StreamStop(),  # 11: a subtransaction of 10
        StreamStart(xid=20), row(20, 3), StreamStop(),
        StreamAbort(xid=10, subxid=11),
        StreamStart(xid=20), row(20, 4), StreamStop(),
        StreamCommit(xid=20, lsn=50),
        Begin(xid=30, lsn=60), row(30, 5), Prepare(xid=30, gid="kept", lsn=61),
        Begin(xid=31, lsn=70), row(31, 6), Prepare(xid=31, gid="done", lsn=71), CommitPrepared(xid=31, gid="done", lsn=72),
        Begin(xid=40, lsn=80), row(40, 7), Commit(xid=40, lsn=81),
    ]
    assembler = TransactionAssembler()
    unfinished = _Unfinished()
    committed = []
    for event in events:
        committed += assembler.feed(event)
        unfinished.track(event)
    assert [r.after["id"] for r in committed if r.after] == ["3", "4", "6", "7"]
    transactions, records = unfinished.open_changes(assembler)
    assert transactions == 2  # stream 10 (still open) and the prepared "kept"
    assert sorted((r.xid, r.after["id"]) for r in records if r.after) == [(10, "1"), (30, "5")]
    assert all(r.commit_lsn is None for r in records)
