"""The generated reference cannot drift from the code, and what it is generated from is complete."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import click
import pytest

from tests.docs.conftest import ROOT, load_generator

gen = load_generator()


def options_without_help(root: click.Command) -> Iterator[str]:
    """``pgpoll <command> --option`` for each option whose help text is empty."""
    for words, command in gen.walk(root):
        for option in gen.options_of(command):
            if not (option.help or "").strip():
                yield " ".join(("pgpoll", *words, option.opts[0]))


def test_every_option_has_help_text() -> None:
    from pgpoll.cli.main import cli

    assert not list(options_without_help(cli)), "options without help text (the reference shows it)"


def test_an_option_without_help_text_is_found() -> None:
    @click.group()
    def group() -> None:
        """A group."""

    @group.command()
    @click.option("--with-help", help="Has some.")
    @click.option("--bare")
    def sub(with_help: str, bare: str) -> None:
        """A command."""

    assert list(options_without_help(group)) == ["pgpoll sub --bare"]


def test_the_committed_reference_is_what_the_code_generates() -> None:
    # in a process of its own, as `make docs` runs it (click caches a command's help option at its first use: in
    # this process other tests have already invoked the commands)
    import subprocess
    import sys

    check = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
    assert check.returncode == 0, ("stale generated pages; run `make docs` (or python docs/gen_reference.py) and "
                                   "commit:\n" + check.stdout + check.stderr)


def test_a_new_option_makes_the_reference_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgpoll.cli.ingest_command import command

    monkeypatch.setattr(command, "params", [*command.params, click.Option(["--brand-new"], help="Something new.")])
    stale = gen.stale_pages()
    assert list(stale) == [gen.CLI_PAGE]
    assert "+| `--brand-new` |" in stale[gen.CLI_PAGE]


def test_every_pgpoll_variable_the_code_reads_is_documented() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    sources = [*ROOT.glob("pgpoll/**/*.py"), *ROOT.glob("jobs/**/*.py"), *ROOT.glob("bench/*.py"), ROOT / "Makefile"]
    named = {v for path in sources for v in re.findall(r"\bPGPOLL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8"))}
    assert named, "no PGPOLL_ variable found: the scan is broken"
    assert not sorted(v for v in named if f"`{v}`" not in page), "add them to docs/reference/environment.md"


def test_every_summary_and_record_key_is_documented() -> None:
    from pgpoll.housekeeping.compact import CompactResult
    from pgpoll.ingest.run import RunSummary
    from pgpoll.materialize.run import TableState
    from pgpoll.observe.run_history import RunRecord
    from pgpoll.sink.commit.compactions import CompactionRecord, Merge
    from pgpoll.sink.commit.log import CommitRecord
    from pgpoll.snapshot.resync import ResyncSummary
    from pgpoll.snapshot.run import SnapshotSummary

    page = (ROOT / "docs" / "reference" / "json-records.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    for heading, record, leave_out in (
        ("`pgpoll ingest` summary", RunSummary, set()),
        ("`pgpoll snapshot` summary", SnapshotSummary, set()),
        ("`pgpoll resync` summary", ResyncSummary, set()),
        ("`pgpoll materialize --json`", TableState, set()),
        ("Commit-log record", CommitRecord, {"name"}),  # the file's name, not stored
        ("Run-history record", RunRecord, set()),
        ("`pgpoll compact` summary", CompactResult, set()),
        ("Compaction record", CompactionRecord, set()),
        ("Compaction record", Merge, set()),
    ):
        keys = {f.name for f in dataclasses.fields(record)} - leave_out
        missing = sorted(k for k in keys if f"`{k}`" not in sections[heading])
        assert not missing, f"docs/reference/json-records.md, {heading}: {missing}"
