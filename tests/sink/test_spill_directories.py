"""A batch's local spill directory on the way to an object store: what a killed process left is removed, nothing else.

Real processes: a dead one (exited, reaped) and a live one (a ``sleep``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgpoll.sink.stores.uploads import new_spill_directory, spill_prefix


@pytest.fixture
def live_pid() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(proc.stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    return pid


def spill(root: Path, name: str) -> Path:
    directory = root / name
    (directory / "envelope").mkdir(parents=True)
    (directory / "envelope" / "part-00000.parquet").write_bytes(b"x" * 1024)
    return directory


def test_a_new_spill_is_named_by_host_and_process_and_removes_only_what_dead_processes_of_this_host_left(
    tmp_path: Path, live_pid: int
) -> None:
    here = spill_prefix()
    dead = spill(tmp_path, f"{here}{dead_pid()}-abc123")
    live = spill(tmp_path, f"{here}{live_pid}-def456")
    mine = spill(tmp_path, f"{here}{os.getpid()}-ghi789")  # an earlier batch of this process, still at work
    other_host = spill(tmp_path, f"pgpoll-batch-another-host-{dead_pid()}-jkl012")
    unrelated = spill(tmp_path, "pgpoll-batch-notapid")

    made = Path(new_spill_directory(str(tmp_path)))

    assert not dead.exists()
    assert all(d.exists() for d in (live, mine, other_host, unrelated))
    assert made.is_dir() and made.parent == tmp_path and made.name.startswith(f"{here}{os.getpid()}-")
    assert made != mine and not any(made.iterdir())


def test_the_default_root_is_the_system_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = spill(tmp_path, f"{spill_prefix()}{dead_pid()}-abc123")
    made = Path(new_spill_directory())
    assert made.parent == tmp_path and not left.exists()
