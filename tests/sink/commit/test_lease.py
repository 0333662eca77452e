"""The output lease: the fast busy answer, expiry, renewal, release and the test switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgpoll.cli.exitcodes import exit_code_for
from pgpoll.errors import SlotBusyError
from pgpoll.sink import layout
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.stores.local import LocalOutputFs


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _lease(tmp_path: Path, run: str, clock: Clock, enabled: bool = True) -> Lease:
    return Lease(LocalOutputFs(str(tmp_path)), run=run, slot="s", ttl=60, clock=clock, enabled=enabled)


def test_a_second_run_is_busy_at_once_until_the_lease_expires(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _lease(tmp_path, "a", clock), _lease(tmp_path, "b", clock)
    first.acquire()
    body = json.loads((tmp_path / layout.LEASE).read_text())
    assert body["run"] == "a" and body["slot"] == "s" and body["expires_at"] == clock.now + 60
    with pytest.raises(SlotBusyError, match="expires in 60 s") as busy:
        second.acquire()
    assert exit_code_for(busy.value) == 3
    clock.now += 30
    first.renew()  # renewed: the other run waits a full ttl from now
    clock.now += 45
    with pytest.raises(SlotBusyError):
        second.acquire()
    clock.now += 16  # the first run died: its lease expired
    second.acquire()
    assert json.loads((tmp_path / layout.LEASE).read_text())["run"] == "b"
    with pytest.raises(SlotBusyError):
        first.renew()  # taken over: the stalled run learns it at its next renewal
    first.release()
    assert (tmp_path / layout.LEASE).exists()  # releasing never removes another run's lease
    second.release()
    assert not (tmp_path / layout.LEASE).exists()


def test_the_same_run_may_acquire_again_and_a_damaged_lease_counts_as_expired(tmp_path: Path) -> None:
    clock = Clock()
    lease = _lease(tmp_path, "a", clock)
    lease.acquire()
    lease.acquire()
    (tmp_path / layout.LEASE).write_text("{")
    _lease(tmp_path, "b", clock).acquire()
    assert json.loads((tmp_path / layout.LEASE).read_text())["run"] == "b"


def test_the_test_switch_turns_the_lease_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPOLL_TEST_NO_LOCK", "1")
    clock = Clock()
    first = Lease(LocalOutputFs(str(tmp_path)), run="a", slot="s", clock=clock)
    second = Lease(LocalOutputFs(str(tmp_path)), run="b", slot="s", clock=clock)
    first.acquire()
    second.acquire()
    first.renew()
    first.release()
    assert not first.enabled and not (tmp_path / layout.LEASE).exists()


def test_a_lease_left_by_a_process_gone_from_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    import socket
    import subprocess

    clock = Clock()
    dead = subprocess.Popen(["true"])  # a process that has exited (and was reaped): its PID is free
    dead.wait()
    (tmp_path / "_pgpoll").mkdir()
    (tmp_path / layout.LEASE).write_text(json.dumps(
        {"run": "killed", "slot": "s", "expires_at": clock.now + 60, "host": socket.gethostname(), "pid": dead.pid}
    ))
    taker = _lease(tmp_path, "next", clock)
    taker.acquire()  # not busy: the holder's process is gone, the expiry need not be waited for
    assert json.loads((tmp_path / layout.LEASE).read_text())["run"] == "next"

    (tmp_path / layout.LEASE).write_text(json.dumps(
        {"run": "elsewhere", "slot": "s", "expires_at": clock.now + 60, "host": "another-host", "pid": dead.pid}
    ))
    with pytest.raises(SlotBusyError):  # a holder on another host is judged by its expiry only
        _lease(tmp_path, "third", clock).acquire()


@pytest.mark.parametrize("where", ["local", "store"])
def test_runs_taking_an_expired_lease_together_leave_one_holder(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import threading

    from pgpoll.sink.stores.filesystem import open_output

    output = str(tmp_path) if where == "local" else request.getfixturevalue("s3_bucket").url
    fs = open_output(output)
    clock = Clock()
    Lease(fs, run="dead", slot="s", ttl=60, clock=clock).acquire()
    clock.now += 61  # its run died elsewhere: expired
    held: list[str] = []
    start = threading.Barrier(4)

    def take(run: str) -> None:
        lease = Lease(fs, run=run, slot="s", ttl=60, clock=clock)
        start.wait()
        try:
            lease.acquire()
            held.append(run)
        except SlotBusyError:
            pass

    threads = [threading.Thread(target=take, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 1, held
    assert json.loads(fs.read_text(fs.path(layout.LEASE)))["run"] == held[0]
