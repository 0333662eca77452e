"""The error hierarchy: message and fix, context attributes, and clean pickling (Spark ships errors)."""

from __future__ import annotations

import pickle

import pytest

from pgpoll import errors

ALL = [
    errors.PgpollError, errors.ConfigError, errors.SlotBusyError, errors.SourceError, errors.SlotNotFoundError,
    errors.PublicationNotFoundError, errors.WrongPluginError, errors.WalLevelError, errors.PrivilegeError,
    errors.SlotInvalidatedError, errors.SlotExistsError, errors.ConnectionFailedError, errors.SinkError,
    errors.DecodeError,
]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_context(cls: type[errors.PgpollError]) -> None:
    error = cls("what failed", "how to fix", lsn="0/10", relation="public.t", message_type="I", sqlstate="55006")
    error.extra = "kept"  # type: ignore[attr-defined]
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls
    assert (again.message, again.hint, again.lsn, again.relation, again.message_type, again.sqlstate) == (
        "what failed", "how to fix", "0/10", "public.t", "I", "55006")
    assert again.extra == "kept"  # type: ignore[attr-defined]
    assert str(again) == str(error) and again.args == ("what failed",)


def test_decode_error_keeps_its_offset_through_pickle() -> None:
    error = errors.DecodeError("bad tuple", "report it", offset=17, lsn="0/1")
    again = pickle.loads(pickle.dumps(error))
    assert (again.offset, again.lsn) == (17, "0/1")


def test_str_is_message_then_fix() -> None:
    assert str(errors.SourceError("slot missing", "create it")) == "slot missing\n  fix: create it"
    assert str(errors.SourceError("slot missing")) == "slot missing"


def test_hierarchy() -> None:
    for source_cls in (errors.SlotNotFoundError, errors.PublicationNotFoundError, errors.WrongPluginError, errors.WalLevelError,
                errors.PrivilegeError, errors.SlotInvalidatedError, errors.SlotExistsError, errors.ConnectionFailedError):
        assert issubclass(source_cls, errors.SourceError)
    for cls in ALL:
        assert issubclass(cls, errors.PgpollError)
    assert not issubclass(errors.SlotBusyError, errors.SourceError)
