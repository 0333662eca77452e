"""Every pgpoll error class maps to its documented exit code."""

from __future__ import annotations

import pytest

from pgpoll import errors
from pgpoll.cli import exitcodes

EXPECTED = {
    errors.ConfigError: exitcodes.USAGE,
    errors.SlotBusyError: exitcodes.SLOT_BUSY,
    errors.FenceLostError: exitcodes.SLOT_BUSY,  # lost the commit log's compare-and-set: another run published
    errors.SourceError: exitcodes.SOURCE,
    errors.SlotNotFoundError: exitcodes.SOURCE,
    errors.PublicationNotFoundError: exitcodes.SOURCE,
    errors.WrongPluginError: exitcodes.SOURCE,
    errors.WalLevelError: exitcodes.SOURCE,
    errors.PrivilegeError: exitcodes.SOURCE,
    errors.SlotInvalidatedError: exitcodes.SOURCE,
    errors.LockTimeoutError: exitcodes.SOURCE,
    errors.SharedSnapshotLostError: exitcodes.SOURCE,
    errors.TableRewrittenError: exitcodes.SOURCE,
    errors.SlotExistsError: exitcodes.SOURCE,
    errors.SlotMovedError: exitcodes.SOURCE,  # a Spark stream's slot moved past its batch start
    errors.SlotGapError: exitcodes.SOURCE,  # the slot and the output disagree (pgpoll.source.slot_gap)
    errors.StandbyWaitError: exitcodes.SOURCE,  # a failover slot's wait cancelled (pgpoll.source.waits)
    errors.ConnectionFailedError: exitcodes.SOURCE,
    errors.SinkError: exitcodes.SINK,
    errors.DecodeError: exitcodes.DECODE,
    errors.PgpollError: exitcodes.UNEXPECTED,
}


def all_error_classes() -> set[type[errors.PgpollError]]:
    found: set[type[errors.PgpollError]] = set()
    todo: list[type[errors.PgpollError]] = [errors.PgpollError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return {c for c in found if c.__module__ == "pgpoll.errors"}


def test_every_error_class_has_an_expected_code() -> None:
    assert all_error_classes() == set(EXPECTED)


@pytest.mark.parametrize(("cls", "code"), EXPECTED.items(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_error_class_maps_to_its_exit_code(cls: type[errors.PgpollError], code: int) -> None:
    assert exitcodes.exit_code_for(cls("message")) == code


def test_non_pgpoll_errors_are_unexpected() -> None:
    assert exitcodes.exit_code_for(ValueError("x")) == exitcodes.UNEXPECTED


def test_codes_are_the_documented_numbers() -> None:
    assert (exitcodes.OK, exitcodes.UNEXPECTED, exitcodes.USAGE, exitcodes.SLOT_BUSY,
            exitcodes.SOURCE, exitcodes.SINK, exitcodes.DECODE, exitcodes.STATUS_ALERT) == (0, 1, 2, 3, 4, 5, 6, 7)
    assert (exitcodes.INTERRUPTED, exitcodes.TERMINATED) == (130, 143)  # 128 + SIGINT, 128 + SIGTERM
    assert sorted(exitcodes.EXIT_CODES) == [0, 1, 2, 3, 4, 5, 6, 7, 130, 143]
