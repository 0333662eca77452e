"""Bad input and broken preconditions: documented exit code, clear message, slot unchanged, nothing visible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg2

from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.stores.filesystem import open_output
from tests.ingest.conftest import confirmed_lsn, ingest, ingest_process, make_capture, read_output


def _assert_failed(result: Any, code: int, *phrases: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr
    assert "fix:" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.summary is not None and result.summary["status"] == "error"
    assert result.summary["exit_code"] == code


def test_missing_slot_exits_4(db: Any, tmp_path: Path) -> None:
    result = ingest(db.dsn, "--slot", "no_such_slot", "--output", str(tmp_path / "out"))
    _assert_failed(result, 4, 'replication slot "no_such_slot" does not exist', "pgpoll slot create")


def test_bad_slot_name_exits_2(db: Any, tmp_path: Path) -> None:
    result = ingest(db.dsn, "--slot", "Bad-Name", "--output", str(tmp_path / "out"))
    _assert_failed(result, 2, "lower-case letters, digits and underscores")


def test_wrong_plugin_exits_4_and_leaves_the_slot(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    before = confirmed_lsn(db, cap.slot)
    result = ingest(db.dsn, *cap.args("--plugin", "pgoutput", "--publication", "p"))
    _assert_failed(result, 4, "uses plugin test_decoding, not pgoutput")
    assert confirmed_lsn(db, cap.slot) == before


def test_missing_publication_exits_4(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    result = ingest(db.dsn, "--slot", cap.slot, "--output", cap.output, "--publication", "nope")
    _assert_failed(result, 4, 'publication "nope" does not exist')


def test_pgoutput_without_a_publication_is_a_usage_error_exit_2(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    before = confirmed_lsn(db, cap.slot)
    result = ingest(db.dsn, "--slot", cap.slot, "--output", cap.output)
    _assert_failed(result, 2, "needs a publication", "--publication")
    assert confirmed_lsn(db, cap.slot) == before
    assert not (Path(cap.output) / "changes").exists()


def test_a_run_while_another_holds_the_outputs_lease_exits_3_having_done_nothing(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    other = Lease(open_output(cap.output), run="another-run", slot=cap.slot, enabled=True)
    other.acquire()
    before = confirmed_lsn(db, cap.slot)
    result = ingest(db.dsn, *cap.args())
    _assert_failed(result, 3, "another ingest run (another-run", "holds the output")
    assert confirmed_lsn(db, cap.slot) == before
    assert not (Path(cap.output) / "changes").exists()
    assert not list((Path(cap.output) / "_pgpoll" / "commits").glob("*.json"))


def test_an_expired_lease_of_a_dead_run_does_not_block_the_next_run(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    dead = Lease(open_output(cap.output), run="killed-run", slot=cap.slot, ttl=-1, enabled=True)
    dead.acquire()  # as a SIGKILLed run leaves it: never released, already expired
    result = ingest(db.dsn, *cap.args())
    assert result.exit_code == 0, result.stderr
    assert result.summary is not None and result.summary["changes"] == 1
    assert not (Path(cap.output) / "_pgpoll" / "lease.json").exists()  # released at the end of the run



def test_output_not_writable_exits_5_and_leaves_the_slot(db: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cap = make_capture(db, "test_decoding", blocker / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    before = confirmed_lsn(db, cap.slot)
    result = ingest(db.dsn, *cap.args())
    _assert_failed(result, 5, "output")
    assert confirmed_lsn(db, cap.slot) == before


def test_an_undecodable_row_exits_6_is_saved_and_nothing_is_visible(db: Any, tmp_path: Path, spark: Any) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    # test_decoding prints message content as raw bytes: this row is not valid UTF-8 text
    db.execute("SELECT pg_logical_emit_message(true, 'bin', '\\xfffe41'::bytea)")
    before = confirmed_lsn(db, cap.slot)
    result = ingest(db.dsn, *cap.args())
    _assert_failed(result, 6, "not valid UTF-8")
    assert confirmed_lsn(db, cap.slot) == before
    assert read_output(spark, cap.output) == []
    rejects = list((Path(cap.output) / "_pgpoll" / "rejects").glob("*.json"))
    assert len(rejects) == 1
    saved = json.loads(rejects[0].read_text())
    assert saved["data_hex"].endswith("fffe41") and "UTF-8" in saved["error"]


def test_an_invalidated_slot_exits_4_and_says_to_recreate_it(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    status = db.lose_slot(cap.slot)
    assert status == "lost", f"could not invalidate the slot (wal_status {status})"
    result = ingest(db.dsn, *cap.args())
    _assert_failed(result, 4, "wal_status = lost", "recreate the slot")


def test_no_password_appears_in_any_output(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    password = db.server.password
    ok = ingest(db.dsn, *cap.args())
    bad = ingest(db.dsn.replace(password, "wrong-" + password[::-1]), *cap.args())
    assert ok.exit_code == 0 and bad.exit_code == 4
    for text in (ok.stdout, ok.stderr, bad.stdout, bad.stderr):
        assert password not in text and password[::-1] not in text


def test_wrong_password_is_not_retried_forever(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    try:
        psycopg2.connect(db.dsn.replace(db.server.password, "nope")).close()
    except psycopg2.OperationalError as exc:
        assert "password authentication failed" in str(exc)
    result = ingest(db.dsn.replace(db.server.password, "nope"), *cap.args())
    assert result.exit_code == 4 and "password authentication failed" in result.stderr
    assert result.summary is not None and result.summary["seconds"] < 5


def test_an_output_below_a_regular_file_exits_5_before_spark_starts(db: Any, tmp_path: Path) -> None:
    cap = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    (tmp_path / "a-file").write_text("not a directory")
    before = confirmed_lsn(db, cap.slot)
    result = ingest_process(db.dsn, "--slot", cap.slot, "--output", str(tmp_path / "a-file" / "out"))
    assert result.exit_code == 5, result.stderr
    assert "fix:" in result.stderr and "Traceback" not in result.stderr
    assert "incubator modules" not in result.stderr  # the JVM (printing this first) never started
    assert confirmed_lsn(db, cap.slot) == before
