"""The peek's prefetch thread: items in order, errors where they happened, the producer closed on an early stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from pgpoll.ingest.peek_chunks import prefetched


def test_items_arrive_in_order_and_the_producer_runs_ahead() -> None:
    produced: list[int] = []

    def items() -> Iterator[int]:
        for i in range(50):
            produced.append(i)
            yield i

    got = prefetched(items(), depth=2)
    assert next(got) == 0
    assert threading.Event().wait(0.3) is False and len(produced) >= 3  # ahead by the queue's depth, no further
    assert len(produced) <= 4
    assert [0, *got] == list(range(50))


def test_an_error_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("the server went away")

    got = prefetched(items())
    assert next(got) == 1 and next(got) == 2
    with pytest.raises(ValueError, match="went away"):
        next(got)


def test_an_early_stop_closes_the_producer_on_its_own_thread() -> None:
    closed: list[str] = []

    def items() -> Iterator[int]:
        try:
            yield from range(1_000_000)
        finally:
            closed.append(threading.current_thread().name)

    got = prefetched(items(), depth=2)
    assert next(got) == 0
    got.close()  # the consumer stops (an error in decoding, an interrupt)
    assert closed == ["pgpoll-peek-fetch"]
