"""The progress line shows on a terminal only, never in cron, CI or a pipe."""

from __future__ import annotations

import io

import pytest

from pgpoll.cli.progress import Progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_line_drawn_over_and_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PGPOLL_NO_PROGRESS", raising=False)
    term = Terminal()
    progress = Progress(term, interval=0)
    progress.update("1 batch(es)")
    progress.update("2 batch(es), more")
    progress.update("3")
    progress.done()
    text = term.getvalue()
    assert text.startswith("\r1 batch(es)") and "\r2 batch(es), more" in text
    assert "\r3" + " " * (len("2 batch(es), more") - 1) in text  # a shorter line blanks the rest of the longer one
    assert text.endswith("\r")  # cleared: the next output starts on a clean line


@pytest.mark.parametrize("env", ["CI", "PGPOLL_NO_PROGRESS"])
def test_ci_and_the_opt_out_keep_a_terminal_quiet(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv(env, "1")
    term = Terminal()
    progress = Progress(term, interval=0)
    progress.update("x")
    progress.done()
    assert term.getvalue() == ""


def test_a_pipe_stays_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    pipe = io.StringIO()
    progress = Progress(pipe, interval=0)
    progress.update("x")
    progress.done()
    assert pipe.getvalue() == ""
