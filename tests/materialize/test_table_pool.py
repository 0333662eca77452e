"""Tables run a few at a time, with the results and the error a one-by-one loop gives (no JVM)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from pgpoll.materialize.table_pool import run_in_order


def test_results_come_back_in_order_whatever_finishes_first() -> None:
    gates = [threading.Event() for _ in range(4)]

    def task(i: int) -> Callable[[], int]:
        def run() -> int:
            if i + 1 < len(gates):
                assert gates[i + 1].wait(5)  # each waits for the next one to finish first
            gates[i].set()
            return i * 10
        return run

    assert run_in_order([task(i) for i in range(4)], threads=4) == [0, 10, 20, 30]


def test_the_first_failure_in_order_is_raised_not_the_first_in_time() -> None:
    late = threading.Event()
    ran: list[int] = []

    def first() -> int:
        assert late.wait(5)  # fails only after the second task failed
        raise ValueError("table 0")

    def second() -> int:
        try:
            raise KeyError("table 1")
        finally:
            late.set()

    def third() -> int:
        ran.append(2)
        return 2

    with pytest.raises(ValueError, match="table 0"):
        run_in_order([first, second, third], threads=2)
    assert ran in ([], [2])  # started only if a thread was free before the failure; never half run


def test_after_a_failure_no_further_table_starts() -> None:
    started: list[int] = []
    release = threading.Event()

    def task(i: int) -> Callable[[], int]:
        def run() -> int:
            started.append(i)
            if i == 0:
                raise RuntimeError("boom")
            assert release.wait(5)
            return i
        return run

    def releaser() -> None:
        release.set()

    timer = threading.Timer(0.5, releaser)
    timer.start()
    with pytest.raises(RuntimeError, match="boom"):
        run_in_order([task(i) for i in range(20)], threads=2)
    timer.cancel()
    assert 0 in started and len(started) <= 3  # the failed one, the one running beside it, at most one racing in


def test_one_thread_runs_them_one_by_one_in_this_thread() -> None:
    here = threading.current_thread()
    seen: list[threading.Thread] = []

    def task() -> int:
        seen.append(threading.current_thread())
        return len(seen)

    assert run_in_order([task, task, task], threads=1) == [1, 2, 3]
    assert seen == [here] * 3
    assert run_in_order([], threads=4) == []
