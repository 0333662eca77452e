"""The import paths the documentation named before the sub-packages still reach the same modules."""

from __future__ import annotations

import importlib

import pytest

MOVED = {
    "pgpoll.sink.filesystem": "pgpoll.sink.stores.filesystem",
    "pgpoll.sink.commit_log": "pgpoll.sink.commit.log",
    "pgpoll.sink.commit_records": "pgpoll.sink.commit.records",
    "pgpoll.sink.commit_checkpoints": "pgpoll.sink.commit.checkpoints",
    "pgpoll.materialize.delta_names": "pgpoll.materialize.delta.names",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_import_path_is_the_new_module(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


def test_names_users_import_from_the_old_paths() -> None:
    from pgpoll.materialize.delta.names import logical_table as new_logical_table
    from pgpoll.materialize.delta_names import logical_table
    from pgpoll.sink.commit.log import CommitLog as NewCommitLog
    from pgpoll.sink.commit_log import CommitLog, summarize
    from pgpoll.sink.filesystem import open_output

    assert CommitLog is NewCommitLog and logical_table is new_logical_table
    assert callable(open_output) and callable(summarize)
