"""The Parquet state's record log: one publisher per state, crashes after the record finished by the next run.

The rules are proven on local directories without a JVM (:mod:`pgpoll.materialize.state_log`
over :class:`~pgpoll.sink.stores.local.LocalOutputFs`); two tests drive ``pgpoll materialize``
with real Spark: a run that stalled past another's publish, and a run killed after its record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgpoll.cli.exitcodes import SINK, exit_code_for
from pgpoll.errors import SinkError
from pgpoll.materialize import state_log
from pgpoll.materialize.run import MaterializeOptions, Materializer, run_materialize
from pgpoll.materialize.state_log import (
    STATE_FILE,
    StateLog,
    StateRecord,
    parse_scratch_name,
    record_name,
    scratch_name,
    stale_scratch,
)
from pgpoll.sink.stores.local import LocalOutputFs
from tests.ingest.conftest import ingest
from tests.materialize.conftest import materialize, state_rows

TABLE = "public.t"


class Killed(BaseException):
    """Stands for a SIGKILL: nothing after it runs in the process's own code."""


def _state_dir(fs: LocalOutputFs, name: str, seq: int, run: str, rows: int = 1) -> None:
    """A state directory as ``Materializer._write`` leaves it: a data file and the marker."""
    fs.mkdirs(fs.path(name))
    fs.write_text(fs.path(name, "part-0.parquet"), f"data of {run}")
    fs.write_text(fs.path(name, STATE_FILE), json.dumps({"position": "0/10", "rows": rows, "seq": seq, "run": run}))


def _published(fs: LocalOutputFs, seq: int, run: str) -> StateRecord:
    scratch = scratch_name(TABLE, seq, run)
    _state_dir(fs, scratch, seq, run)
    record = StateRecord(seq, TABLE, scratch, run, {"position": "0/10", "seq": seq, "run": run})
    StateLog(fs, TABLE).publish(record)
    return record


def _marker(fs: LocalOutputFs, name: str = TABLE) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fs.read_text(fs.path(name, STATE_FILE)))
    return data


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_of_two_runs_that_pinned_the_same_state_one_publishes_and_the_other_changes_nothing(tmp_path: Path) -> None:
    fs = LocalOutputFs(str(tmp_path))
    _state_dir(fs, TABLE, 0, "legacy")  # a DEST written before the record log: state 0
    states = StateLog(fs, TABLE)
    assert states.pin() == 0
    first = _published(fs, 1, "aaaa1111")
    scratch = scratch_name(TABLE, 1, "bbbb2222")
    _state_dir(fs, scratch, 1, "bbbb2222")
    second = StateRecord(1, TABLE, scratch, "bbbb2222", {"position": "0/20"})
    with pytest.raises(SinkError) as lost:
        states.commit(second)
    assert "run aaaa1111" in lost.value.message and "state 1" in lost.value.message
    assert exit_code_for(lost.value) == SINK
    assert states.owns(first) and not states.owns(second)
    assert not fs.exists(fs.path(scratch)) and _marker(fs)["run"] == "legacy"  # the loser changed nothing
    assert states.finish(first)
    assert _marker(fs)["run"] == "aaaa1111" and states.head() == 1
    assert stale_scratch(fs, scratch)  # the loser's directory: removed by it, or by the next run's clean-up


def test_a_publish_killed_before_its_swap_is_finished_by_the_next_pin(tmp_path: Path) -> None:
    fs = LocalOutputFs(str(tmp_path))
    _state_dir(fs, TABLE, 1, "old")
    record = _published(fs, 2, "cccc3333")  # killed here: record 2 exists, the table still holds state 1
    assert _marker(fs)["seq"] == 1  # readers see the older state, never one no record names
    assert not stale_scratch(fs, record.scratch)  # the run's start-up clean-up keeps it
    assert StateLog(fs, TABLE).pin() == 2
    assert _marker(fs)["run"] == "cccc3333"
    assert _entries(tmp_path) == [state_log.LOG_DIR, TABLE]  # the old state set aside and removed
    assert StateLog(fs, TABLE).finish(record)  # idempotent
    assert _marker(fs)["run"] == "cccc3333"


def test_a_publish_killed_after_the_old_state_was_set_aside_is_finished_too(tmp_path: Path) -> None:
    fs = LocalOutputFs(str(tmp_path))
    record = _published(fs, 1, "dddd4444")
    _state_dir(fs, scratch_name(TABLE, 0, "dddd4444-old"), 0, "old")  # the swap's first rename happened
    assert StateLog(fs, TABLE).pin() == 1
    assert _marker(fs)["run"] == "dddd4444"
    assert stale_scratch(fs, scratch_name(TABLE, 0, "dddd4444-old"))
    assert not fs.exists(fs.path(record.scratch))


def test_a_published_state_whose_directory_is_gone_leaves_the_table_at_its_older_state(tmp_path: Path) -> None:
    fs = LocalOutputFs(str(tmp_path))
    _state_dir(fs, TABLE, 1, "old")
    record = _published(fs, 2, "eeee5555")
    fs.delete(fs.path(record.scratch))
    assert not StateLog(fs, TABLE).finish(record)
    assert StateLog(fs, TABLE).pin() == 2 and _marker(fs)["run"] == "old"


def test_only_directories_no_run_will_publish_or_swap_in_are_stale(tmp_path: Path) -> None:
    fs = LocalOutputFs(str(tmp_path))
    head = _published(fs, 2, "ffff6666")
    assert not stale_scratch(fs, head.scratch)  # named by the head: finished by the next pin
    assert stale_scratch(fs, scratch_name(TABLE, 2, "gggg7777"))  # lost the race for 2
    assert stale_scratch(fs, scratch_name(TABLE, 1, "hhhh8888"))  # older than the head
    assert not stale_scratch(fs, scratch_name(TABLE, 3, "iiii9999"))  # a live run may still publish 3
    assert stale_scratch(fs, f"{TABLE}.materializing-1a2b3c4d")  # written by an older pgpoll
    assert not stale_scratch(fs, TABLE)
    assert parse_scratch_name(scratch_name("Odd%20S.t", 12, "ab-old")) == ("Odd%20S.t", 12)
    assert record_name(3) == "seq-0000000000000003.json"
    assert StateLog(fs, TABLE).head() == 2


# ---- with Spark and PostgreSQL ------------------------------------------------------------------------------


def _ingest(db: Any, slot: str, out: str) -> None:
    assert ingest(db.dsn, "--slot", slot, "--output", out, "--typed-tables").exit_code == 0


def _source(db: Any) -> list[dict[str, Any]]:
    return [{"id": r[0], "v": r[1]} for r in db.execute("SELECT id, v FROM t ORDER BY id")]


def _state(spark: Any, out: str) -> list[dict[str, Any]]:
    return sorted(state_rows(spark, out, "public", "t"), key=lambda r: r["id"])


def _setup(db: Any, tmp_path: Path) -> tuple[str, str]:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    out = str(tmp_path / "out")
    _ingest(db, slot, out)
    code, _tables, err = materialize(out)
    assert code == 0, err
    db.execute("UPDATE t SET v = 'b2' WHERE id = 2")
    db.execute("INSERT INTO t VALUES (3, 'c')")
    _ingest(db, slot, out)
    return slot, out


@pytest.mark.parametrize("engine", ["spark", "driver"])
def test_a_run_that_stalled_while_another_published_gets_exit_5_and_changes_nothing(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    _slot, out = _setup(db, tmp_path)
    monkeypatch.setenv("PGPOLL_MATERIALIZE_ENGINE", engine)
    monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")  # the lease expired: only the fence is left
    winner: list[Any] = []

    class Stalled(Materializer):
        def _write(self, name: str, frame: Any, marker: dict[str, Any], key: list[str]) -> int:
            return super()._write(name, frame.localCheckpoint(), marker, key)  # computed before the stall

        def _publish(self, name: str, marker: dict[str, Any], files: Callable[[str], int]) -> int:
            winner.extend(run_materialize(MaterializeOptions(output=out), spark))  # this run stalls here
            return super()._publish(name, marker, files)

    with pytest.raises(SinkError) as lost:
        run_materialize(MaterializeOptions(output=out), spark, materializer=Stalled)
    dest = Path(out) / "state"
    record = json.loads((dest / state_log.LOG_DIR / TABLE / record_name(2)).read_text())
    assert f"run {record['run']}" in lost.value.message and exit_code_for(lost.value) == SINK
    assert [w.mode for w in winner] == ["incremental"]
    assert _entries(dest) == [state_log.LOG_DIR, TABLE]  # the loser removed its directory
    marker = json.loads((dest / TABLE / STATE_FILE).read_text())
    assert (marker["seq"], marker["run"]) == (2, record["run"])  # the winner's state stayed
    assert _state(spark, out) == _source(db)


def test_a_materialize_killed_after_its_record_is_finished_by_the_next_run(
    db: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slot, out = _setup(db, tmp_path)
    real_publish = StateLog.publish

    def publish_then_die(self: StateLog, record: StateRecord) -> None:
        real_publish(self, record)
        raise Killed("between the record and the swap")

    monkeypatch.setattr(StateLog, "publish", publish_then_die)
    with pytest.raises(Killed):
        run_materialize(MaterializeOptions(output=out), spark)
    monkeypatch.setattr(StateLog, "publish", real_publish)
    dest = Path(out) / "state"
    assert json.loads((dest / TABLE / STATE_FILE).read_text())["seq"] == 1  # readers still see the older state
    assert len(_entries(dest)) == 3  # the published directory waits beside it
    code, tables, err = materialize(out)
    assert code == 0, err
    assert tables[0]["mode"] == "unchanged"  # the killed run's state, finished, already holds every change
    assert json.loads((dest / TABLE / STATE_FILE).read_text())["seq"] == 2
    assert _entries(dest) == [state_log.LOG_DIR, TABLE]
    assert _state(spark, out) == _source(db)
