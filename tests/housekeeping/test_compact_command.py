"""``pgpoll compact``'s command line: its summary, a usage error (exit 2), another compaction holding the output
(exit 3, nothing changed)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.sink import layout
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.stores.filesystem import open_output


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["compact", *args])
    return result.exit_code, result.output


def test_an_output_with_nothing_to_merge_prints_an_empty_summary(tmp_path: Path) -> None:
    code, text = run("--output", str(tmp_path / "out"), "--min-age", "0")
    assert code == 0, text
    summary = json.loads(text.strip().splitlines()[-1])
    assert (summary["compaction"], summary["merges"], summary["files_before"], summary["files_after"]) == (0, 0, 0, 0)


def test_a_target_size_of_nothing_is_a_usage_error(tmp_path: Path) -> None:
    code, text = run("--output", str(tmp_path / "out"), "--target-size", "0")
    assert code == 2 and "--target-size" in text and "128MB" in text


def test_another_compaction_holding_the_output_exits_3_at_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    held = Lease(open_output(str(out)), run="other", slot="", path=layout.COMPACTION_LEASE, what="compaction",
                 enabled=True)
    held.acquire()
    try:
        code, text = run("--output", str(out), "--min-age", "0")
    finally:
        held.release()
    assert code == 3 and "another compaction (other" in text, text
    assert not (out / layout.COMPACTIONS).exists() and not (out / layout.COMPACTION_STAGING).exists()
