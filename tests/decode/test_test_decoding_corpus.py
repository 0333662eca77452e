"""Every line of the corpus of real test_decoding output must decode.

The corpus (``lines.jsonl``: lines from PostgreSQL's
``contrib/test_decoding/expected/*.out``, see ``corpus/test_decoding/README.md``)
is vendored beside this test, so a fresh clone anywhere has it. ``PGPOLL_CORPUS``
may point at another copy (the ``lines.jsonl`` file, or a directory holding it,
or ``test_decoding/lines.jsonl``, or ``corpus/test_decoding/lines.jsonl``); it is
looked at first. A missing corpus is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pgpoll.changes import (
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Ignored,
    LogicalMessage,
    Op,
    Prepare,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from pgpoll.decode.text_decoder import TestDecodingDecoder

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
_SUFFIXES = ("", "lines.jsonl", "test_decoding/lines.jsonl", "corpus/test_decoding/lines.jsonl")


def _candidates() -> list[Path]:
    env = os.environ.get("PGPOLL_CORPUS")
    bases = [Path(env)] if env else []
    bases.append(CORPUS_DIR)
    return [base / suffix if suffix else base for base in bases for suffix in _SUFFIXES]


def _corpus_path() -> Path:
    tried = _candidates()
    for path in tried:
        if path.is_file():
            return path
    pytest.fail(
        "test_decoding corpus not found; looked at:\n  "
        + "\n  ".join(str(p) for p in tried)
        + "\nset PGPOLL_CORPUS to the lines.jsonl file or its directory",
        pytrace=False,
    )
    raise AssertionError("unreachable")  # pytest.fail raises


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    with _corpus_path().open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    assert rows, "the corpus is empty"
    return rows


# Leading text of a line -> the event types it may decode to.
_KINDS: list[tuple[str, tuple[type, ...]]] = [
    ("table ", (RowChange, Truncate)),
    ("BEGIN", (Begin,)),
    ("COMMIT PREPARED ", (CommitPrepared,)),
    ("COMMIT", (Commit,)),
    ("message: ", (LogicalMessage,)),
    ("PREPARE TRANSACTION ", (Prepare,)),
    ("ROLLBACK PREPARED ", (RollbackPrepared,)),
    ("opening a streamed block", (StreamStart,)),
    ("closing a streamed block", (StreamStop,)),
    ("aborting streamed", (StreamAbort,)),
    ("committing streamed", (StreamCommit,)),
    ("preparing streamed", (Prepare,)),
    ("streaming message: transactional: 1", (Ignored,)),
    ("streaming message: transactional: 0", (LogicalMessage,)),
    ("streaming ", (Ignored,)),
]


def test_every_corpus_line_decodes(corpus: list[dict[str, Any]]) -> None:
    decoder = TestDecodingDecoder()
    for row in corpus:
        line = row["line"]
        event = decoder.decode(line, lsn=0x16B1970, xid=1)
        kinds = next(k for prefix, k in _KINDS if line.startswith(prefix))
        assert isinstance(event, kinds), (row["file"], line[:120], event)


def test_every_table_line_survives_a_fresh_and_a_cached_decode(corpus: list[dict[str, Any]]) -> None:
    cached = TestDecodingDecoder()
    for row in corpus:
        if row["line"].startswith("table "):
            cached.decode(row["line"])
    for row in corpus:
        line = row["line"]
        if line.startswith("table "):
            assert cached.decode(line) == TestDecodingDecoder().decode(line), line[:120]


def _find(corpus: list[dict[str, Any]], file: str, start: str) -> str:
    return str(next(r["line"] for r in corpus if r["file"] == file and r["line"].startswith(start)))


def test_corpus_spot_checks(corpus: list[dict[str, Any]]) -> None:
    dec = TestDecodingDecoder()
    line = _find(corpus, "messages.out", "message: transactional: 1 prefix: test, sz: 11")
    assert dec.decode(line) == LogicalMessage(True, "test", b"czechtastic")

    line = _find(corpus, "toast.out", "table public.xpto: UPDATE: id[integer]:1 toasted_col1")
    assert dec.decode(line) == RowChange(
        Op.UPDATE,
        "public",
        "xpto",
        (
            Column("id", "integer"),
            Column("toasted_col1", "text"),
            Column("rand1", "double precision"),
            Column("toasted_col2", "text"),
            Column("rand2", "double precision"),
        ),
        None,
        {"id": "1", "rand1": "123.456", "rand2": "1578"},
        ("toasted_col1", "toasted_col2"),
    )

    line = _find(corpus, "ddl.out", "table public.table_with_pkey: UPDATE: old-key: id[integer]:2")
    assert dec.decode(line) == RowChange(
        Op.UPDATE,
        "public",
        "table_with_pkey",
        (Column("id", "integer"), Column("data", "integer")),
        {"id": "2"},
        {"id": "-2", "data": "3"},
    )

    line = _find(corpus, "truncate.out", "table public.tab1, public.tab2")
    assert dec.decode(line) == Truncate(
        (("public", "tab1"), ("public", "tab2")), cascade=False, restart_identity=False
    )
    line = _find(corpus, "twophase.out", "ROLLBACK PREPARED")
    assert dec.decode(line) == RollbackPrepared(xid=None, gid="test_prepared#2")


def test_missing_corpus_fails_and_says_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PGPOLL_CORPUS", str(tmp_path / "nowhere"))
    monkeypatch.setitem(globals(), "CORPUS_DIR", tmp_path / "clone" / "tests" / "decode" / "corpus")
    with pytest.raises(pytest.fail.Exception) as err:
        _corpus_path()
    assert str(tmp_path / "nowhere") in str(err.value)
    assert str(tmp_path / "clone" / "tests" / "decode" / "corpus" / "test_decoding" / "lines.jsonl") in str(err.value)
