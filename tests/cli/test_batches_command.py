"""``pgpoll batches``: the committed batches of a real ingest, then totals; a new output lists none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli import batches_command
from pgpoll.cli.main import cli
from tests.ingest.conftest import ingest, make_capture


def test_batches_lists_each_committed_batch_newest_last_then_totals(
    db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, 'a' FROM generate_series(1, 20) g")
    db.execute("INSERT INTO items SELECT g, 'b' FROM generate_series(21, 30) g")
    first = ingest(db.dsn, *capture.args("--batch-changes", "5"))
    assert first.exit_code == 0, first.stderr
    db.execute("UPDATE items SET v = 'c' WHERE id <= 3")
    second = ingest(db.dsn, *capture.args())
    assert second.exit_code == 0, second.stderr

    result = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    batches, total = lines[:-1], lines[-1]["totals"]
    data = [b for b in batches if b["rows"]]
    assert [b["rows"] for b in data] == [20, 10, 3]
    assert [b["seq"] for b in batches] == sorted(b["seq"] for b in batches)
    assert all(b["bytes"] > 0 and b["files"] >= 1 and b["last_commit_ts"] for b in data)
    assert total["rows"] == 33 and total["batches"] == len(batches)
    assert total["bytes"] == sum(b["bytes"] for b in batches)
    assert total["last_lsn"] == batches[-1]["end"] and total["newest_change"] == data[-1]["last_commit_ts"]

    text = CliRunner().invoke(cli, ["batches", "--output", capture.output])
    assert text.exit_code == 0
    assert text.output.splitlines()[0].split()[:3] == ["seq", "lsn_range", "rows"]
    assert text.output.splitlines()[-1].startswith(f"total: {len(batches)} batch(es), 33 row(s)")

    # the newest by default (read by name: a bounded read), --last N, --all for the whole history
    monkeypatch.setattr(batches_command, "DEFAULT_LAST", 2)
    newest = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--json"])
    assert [json.loads(line) for line in newest.output.splitlines()[:-1]] == batches[-2:]
    assert json.loads(newest.output.splitlines()[-1])["totals"]["batches"] == 2
    footer = CliRunner().invoke(cli, ["batches", "--output", capture.output]).output.splitlines()[-1]
    assert footer.endswith(f"(the newest 2 of {len(batches)}; --all lists every one)"), footer
    three = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--last", "3", "--json"])
    assert [json.loads(line)["seq"] for line in three.output.splitlines()[:-1]] == [b["seq"] for b in batches[-3:]]
    every = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--all", "--json"])
    assert every.output == result.output
    text_all = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--all"])
    assert text_all.output == text.output
    both = CliRunner().invoke(cli, ["batches", "--output", capture.output, "--all", "--last", "3"])
    assert both.exit_code == 2 and "--all and --last exclude each other" in both.output


def test_batches_of_a_new_output_is_empty_with_zero_totals(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["batches", "--output", str(tmp_path / "none"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip())["totals"]["batches"] == 0
