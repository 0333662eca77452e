"""``pgpoll retain`` on a real output: what it removes, what holds it, and the states after it.

One output, built by real ingest, snapshot and materialize runs against the
session's server, goes through the whole life of retention: a dry run, a
destination that is behind, its unregistration, a table's snapshot that
holds the floor, a table without one (refused by a new destination and by
``--full`` until it is snapshotted), a superseded snapshot, and ingest and
incremental materialize afterwards. The states are compared with the source
at every step. It needs more than 30 s: a table on a snapshot is materialized
by a Spark job, and it takes eight of those (about 6 s each here) to prove a
destination left behind, ``--full``, a new destination and a superseded
snapshot; it uses the session's SparkSession (``spark``), whose start the
suite pays once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.reader import read_changes_arrow
from pgpoll.sink.change_table import ChangeTable
from pgpoll.sink.commit.floor import read_floor
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.delta_read import read_delta
from pgpoll.sink.destinations import registered
from pgpoll.sink.layout import table_dir_name
from pgpoll.sink.stores.filesystem import open_output
from tests.ingest.conftest import Capture, ingest, make_capture
from tests.materialize.conftest import materialize


def _run(*args: str, dsn: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"PGPOLL_DSN": dsn} if dsn else None)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _retain(output: str, *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = _run("retain", "--output", output, "--json", *args)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return code, lines[-1] if lines else {}, err


def _snapshot(cap: Capture, table: str) -> None:
    code, out, err = _run("snapshot", "--slot", cap.slot, "--output", cap.output, "--publication", "pub_items",
                          "--tables", table, "--json", dsn=cap.db.dsn)
    assert code == 0, out + err


def _writes(cap: Capture, sql: list[str]) -> None:
    for statement in sql:  # one transaction each: one batch each under --batch-changes 1
        cap.db.execute(statement)
    assert ingest(cap.db.dsn, *cap.args("--typed-tables", "--batch-changes", "1")).exit_code == 0


def _source(cap: Capture, table: str) -> list[dict[str, Any]]:
    return [{"id": i, "v": v} for i, v in cap.db.execute(f"SELECT id, v FROM {table} ORDER BY id")]


def _parquet(dest: Path, table: str) -> list[dict[str, Any]]:
    rows = pq.read_table(str(dest / table_dir_name("public", table))).to_pylist()
    return sorted(({"id": r["id"], "v": r["v"]} for r in rows), key=lambda r: r["id"])


def _delta(dest: Path, table: str) -> list[dict[str, Any]]:
    rows = read_delta(str(dest / table_dir_name("public", table))).to_pylist()
    return sorted(({"id": r["id"], "v": r["v"]} for r in rows), key=lambda r: r["id"])


def _equal_to_source(cap: Capture, dest: Path, read: Any = _parquet) -> None:
    for table in ("items", "other"):
        assert read(dest, table) == _source(cap, table), table


def test_retention_keeps_what_destinations_and_snapshots_need_and_states_stay_equal(db: Any, tmp_path: Path,
                                                                                      spark: Any) -> None:
    del spark  # started by the fixture: materialize's Spark jobs run on it
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    out = Path(cap.output)
    db.execute("ALTER PUBLICATION pub_items ADD TABLE other")
    _writes(cap, [f"INSERT INTO items VALUES ({i}, 'a{i}')" for i in range(1, 7)]
            + [f"INSERT INTO other VALUES ({i}, 'o{i}')" for i in range(1, 6)])
    dest_a, dest_b = tmp_path / "a", tmp_path / "b"
    assert materialize(cap.output, "--to", str(dest_a))[0] == 0
    assert materialize(cap.output, "--to", str(dest_b), "--format", "delta")[0] == 0  # then left behind
    _snapshot(cap, "public.items")
    _writes(cap, [f"DELETE FROM other WHERE id = {i}" for i in range(1, 3)]
            + [f"INSERT INTO other VALUES ({i}, 'p{i}')" for i in range(100, 103)]
            + [f"UPDATE items SET v = 'b{i}' WHERE id = {i}" for i in range(1, 5)])
    assert materialize(cap.output, "--to", str(dest_a))[0] == 0
    log = CommitLog(open_output(cap.output))
    head = log.state().head
    assert head >= 20 and log.state().checkpoint is None  # retention folds them into a checkpoint first
    records_before = sorted(p.name for p in (out / "_pgpoll" / "commits").iterdir())

    # a dry run lists what would go and what holds the rest, and removes nothing
    code, plan, err = _retain(cap.output, "--retention", "0", "--dry-run")
    assert code == 0, err
    assert plan["dry_run"] is True and plan["batches"] > 0 and plan["partitions"]
    assert any(str(dest_b) in h for h in plan["held_by"])
    assert sorted(p.name for p in (out / "_pgpoll" / "commits").iterdir()) == records_before
    assert read_floor(open_output(cap.output)) is None
    assert {d["dest"] for d in plan["destinations"]} == {str(dest_a), str(dest_b)}

    # the destination left behind stops retention there, with a warning naming it
    code, done, err = _retain(cap.output, "--retention", "0")
    assert code == 0, err
    floor = read_floor(open_output(cap.output))
    assert floor is not None and floor.done and floor.seq == done["floor"] and done["batches"] > 0
    b_position = next(d for d in registered(open_output(cap.output)) if d.dest == str(dest_b)).position()
    assert b_position is not None and floor.end_lsn <= b_position < CommitLog(open_output(cap.output)).read(floor.seq + 1).end_lsn
    assert str(dest_b) in err and "--unregister" in err
    gone = list(done["partitions"])
    assert gone and not any((out / "changes" / p).exists() for p in gone)
    assert not (out / "_pgpoll" / "commits" / "seq-0000000000000001.json").exists()
    # the change table: one version of removes (dataChange true), its application transaction kept
    table = ChangeTable(open_output(cap.output))
    assert table.added() == CommitLog(open_output(cap.output)).state().newest_data()
    newest = sorted((out / "changes" / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in newest.read_text().splitlines()]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert removes and all(r["dataChange"] is True for r in removes)
    assert {r["path"].split("/")[0] for r in removes} == set(gone)
    kept_rows = sum(CommitLog(open_output(cap.output)).read(s).rows for s in range(floor.seq + 1, head + 1))
    assert read_changes_arrow(cap.output).num_rows == kept_rows

    # both destinations go on incrementally and equal the source; start-up reads no listing
    assert materialize(cap.output, "--to", str(dest_b), "--format", "delta")[0] == 0
    _equal_to_source(cap, dest_b, _delta)
    state = CommitLog(open_output(cap.output)).state()
    assert state.listed is False and state.head == head

    # unregistered, the destination no longer holds it: the items snapshot does (and other has none: warned)
    code, stdout, _ = _run("retain", "--output", cap.output, "--unregister", str(dest_b))
    assert code == 0 and f"unregistered {dest_b}" in stdout
    code, done, err = _retain(cap.output, "--retention", "0")
    assert code == 0, err
    assert any("snapshot" in h and "public.items" in h for h in done["held_by"]), done
    assert done["batches"] == 5  # other's: up to the first change of items after its snapshot
    assert "public.other has no complete snapshot" in err and "pgpoll snapshot --tables" in err
    floor = read_floor(open_output(cap.output))
    assert floor is not None and "public.other" in floor.tables

    # a new destination and --full: items built on its snapshot, other refused (exit 2) with the fix
    dest_c = tmp_path / "c"
    code, tables, err = materialize(cap.output, "--to", str(dest_c))
    assert code == 2
    assert {t["table"]: t["mode"] for t in tables} == {"public.items": "full", "public.other": "refused"}
    assert "pgpoll retain removed" in err and "pgpoll snapshot --tables public.other" in err
    assert _parquet(dest_c, "items") == _source(cap, "items")
    code, tables, err = materialize(cap.output, "--to", str(dest_a), "--full")
    assert code == 2 and {t["table"]: t["mode"] for t in tables}["public.other"] == "refused"
    _equal_to_source(cap, dest_a)  # the refused table's state is left as it was: still equal

    # the fix: a snapshot of other; then the new destination builds it, and the older items snapshot is superseded
    _snapshot(cap, "public.other")
    _snapshot(cap, "public.items")
    _writes(cap, ["UPDATE other SET v = 'late' WHERE id = 101", "INSERT INTO items VALUES (500, 'late')"])
    assert materialize(cap.output, "--to", str(dest_c))[0] == 0
    _equal_to_source(cap, dest_c)
    snapshots_before = sorted(p.name for p in (out / "_pgpoll" / "snapshots").iterdir())
    code, done, err = _retain(cap.output, "--retention", "0")
    assert code == 0, err
    assert done["snapshots"] == [snapshots_before[0]]  # the first items snapshot: a newer one holds items
    assert sorted(p.name for p in (out / "_pgpoll" / "snapshots").iterdir()) == snapshots_before[1:]
    assert not (out / "snapshots" / snapshots_before[0]).exists()
    for dest in (dest_a, dest_c):
        assert materialize(cap.output, "--to", str(dest))[0] == 0
        _equal_to_source(cap, dest)
