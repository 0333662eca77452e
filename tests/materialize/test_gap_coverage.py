"""Which tables without a snapshot after a gap missed nothing in it (:func:`captured_after_gap`), on plain values.

Only a table that everything says was not captured before the resync's
snapshot is built from its changes after the gap; any doubt refuses it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgpoll.materialize.snapshot_merge import captured_after_gap
from pgpoll.sink.commit.log import CommitRecord

GAP = CommitRecord(start="0/100", end="0/100", rows=0, files=[], partition=None, slot="s", plugin="pgoutput",
                   seq=5, kind="gap", resume="0/500")


def record(seq: int, start: str) -> CommitRecord:
    return CommitRecord(start=start, end=start, rows=1, files=[], partition="p", slot="s", plugin="pgoutput", seq=seq)


def resync_snapshot(plan_lsn: int, **args: Any) -> tuple[None, dict[str, Any], None]:
    return None, {"plan_lsn_int": plan_lsn, "args": {"tables": [], "exclude_tables": [], **args}}, None


def test_a_table_first_captured_after_the_resyncs_snapshot_missed_nothing() -> None:
    assert captured_after_gap(GAP, [record(7, "0/900")], None, [resync_snapshot(0x600)], None)
    assert captured_after_gap(GAP, [record(7, "0/900")], {"position": "0/900"}, [resync_snapshot(0x600)], None)  # its
    # own state, built after the gap by an earlier run: still nothing missed


@pytest.mark.parametrize(("records", "marker", "snapshots", "why"), [
    ([record(3, "0/50"), record(7, "0/900")], None, [resync_snapshot(0x600)], "a record before the gap"),
    ([record(7, "0/900")], {"position": "0/100"}, [resync_snapshot(0x600)], "a state from before the gap"),
    ([record(7, "0/900")], None, [], "no resync snapshot (interrupted)"),
    ([record(7, "0/900")], None, [resync_snapshot(0x600, tables=["public.items"])], "a restricted resync"),
    ([record(7, "0/550")], None, [resync_snapshot(0x600)], "changes before the resync's snapshot"),
    ([record(7, "0/900")], None, [resync_snapshot(0x400)], "a snapshot planned before the gap's resume"),
])
def test_any_doubt_refuses(records: list[CommitRecord], marker: dict[str, Any] | None, snapshots: list[Any],
                           why: str) -> None:
    assert not captured_after_gap(GAP, records, marker, snapshots, None), why
