"""``pgpoll status`` as a library: how far each slot is behind, and whether to alert.

Combines the server's view (:mod:`pgpoll.source.server_state`: position, lag in
bytes, ``wal_status``, ``safe_wal_size``, active PID) with, given an output
path, the commit log's (:mod:`pgpoll.sink.commit.log`: high-water mark,
newest captured commit time). Nothing here starts Spark, peeks, locks or
moves a slot, so it can never make a run fail or wait.

Lag in bytes is WAL written since the slot's confirmed position: what the
next run still has to read (it counts WAL of every database of the server).
A run that catches up ends with a heartbeat it consumes, so right after it the
lag in bytes is only the WAL written since.

Lag in time (``lag_seconds``) is 0 when nothing is pending, otherwise an upper
bound of the age of the oldest change not yet in the output. Every run that
catches up records, in its last commit-log record, the captured tables'
cumulative write counters (``pg_stat_user_tables``: inserts, updates,
deletes) as read before its last peek. When the counters are unchanged,
nothing captured can be pending: 0. Otherwise every pending change was
committed after that read, so its age is at most the time since the read
(``lag_basis`` "counters"). Outputs without such a record (written before this
version, or the counters could not be read) fall back to the server's clock
minus the commit time of the newest change in the output (``lag_basis``
"commit_time"), which grows on an idle source. The counters count aborted
writes too and are flushed by the server about once a second: both can only
make the lag look larger, never hide a pending change. TRUNCATE is not
counted.

On a hot standby the counters are not used: the startup process that
replays the primary's writes counts none of them (a backend reports its
counts at its own transaction's end), so the standby's counters stand still
while the primary writes and would show a false 0. There the lag is
"commit_time", and the WAL end is the standby's replay position
(``pg_last_wal_replay_lsn()``): lag in bytes is WAL the standby has replayed
that the slot has not consumed, not counting how far the standby itself is
behind the primary.

The output's position against the slot's ``confirmed_flush_lsn``:

``in_sync``
    the slot is where the last committed batch left it.
``slot_behind_output``
    the server returned the slot to an older checkpointed position (after a
    crash); harmless, the next run re-advances it.
``slot_ahead_of_output``
    the slot was moved past the output by something else (another consumer,
    a manual advance, a recreated slot): the changes between are not in the
    output.
``no_commits``
    the output has no commit-log record yet.
``other_server``, ``timeline_diverged``
    the slot is at or behind the output but on another database system, or
    on a timeline that left the output's before its high-water mark.

``timeline_unverified``
    the server is on another timeline than the output's newest record and
    this role may not read the timeline history to tell (EXECUTE on
    ``pg_read_binary_file``): reported, not raised, so the report is still
    printed before the exit 4.

``slot_ahead_of_output``, ``other_server``, ``timeline_diverged`` and
``timeline_unverified`` are alerts that ``ingest`` refuses to run on (exit 4): the shared check of
:mod:`pgpoll.source.slot_gap`, which reads the slot first and the output's
head after it, and reads both again before it reports a gap, so a run that
publishes and advances meanwhile never shows as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.sink.commit.head import output_head
from pgpoll.sink.commit.log import CommitLog, CommitLogSummary, summarize
from pgpoll.sink.stores.filesystem import check_readable, open_output
from pgpoll.source.connection import ConnectionTarget, connect
from pgpoll.source.server_identity import ServerIdentity, read_identity, read_timeline_history
from pgpoll.source.server_state import read_server_state, table_write_counts
from pgpoll.source.slot_gap import GAP_POSITIONS, OutputHead, Verdict, check_slot_gap
from pgpoll.source.slots import SlotInfo, get_slot

LOST = "lost"
LAG = "lag"
UNRESERVED = "unreserved"
SLOT_AHEAD = "slot_ahead_of_output"


@dataclass(frozen=True)
class CaughtUp:
    """The newest run that caught up: when it read the captured tables' write counters, and their values."""

    read_at: datetime
    counts: dict[str, list[int]]


def last_caught_up(output: str, commit_log: CommitLog | None = None) -> CaughtUp | None:
    """The write counters recorded by the newest run that caught up (None: no such record since the checkpoint)."""
    state = (commit_log or CommitLog(open_output(output))).state()
    for record in reversed(state.tail):
        stats = record.table_stats
        if stats and isinstance(stats.get("tables"), dict) and stats.get("read_at"):
            try:
                read_at = datetime.fromisoformat(str(stats["read_at"]))
            except ValueError:
                return None
            return CaughtUp(read_at, {str(k): [int(x) for x in v] for k, v in stats["tables"].items()})
    return None


@dataclass(frozen=True)
class SlotStatus:
    """One slot's status; the output fields are set when an output path was given."""

    info: SlotInfo
    current_lsn: Lsn
    checked_at: datetime
    output: CommitLogSummary | None = None
    alerts: tuple[str, ...] = ()

    caught_up: CaughtUp | None = None
    current_counts: dict[str, list[int]] | None = None
    verdict: Verdict | None = None
    """The gap check's verdict (with an output): read slot-first, so no false alarm from a concurrent run."""

    @property
    def lag_basis(self) -> str | None:
        """How :attr:`lag_seconds` was found: "counters" or "commit_time" (see the module doc)."""
        if self.output is None:
            return None
        if self.caught_up is not None and self.current_counts is not None:
            return "counters"
        return "commit_time" if self.output.last_commit_ts is not None else None

    @property
    def lag_seconds(self) -> float | None:
        """0 when nothing is pending, else an upper bound of the oldest pending change's age (module doc)."""
        if self.lag_basis == "counters" and self.caught_up is not None and self.current_counts is not None:
            recorded = self.caught_up.counts
            if all(self.current_counts.get(table) == counts for table, counts in recorded.items()):
                return 0.0
            return round(max(0.0, (self.checked_at - self.caught_up.read_at).total_seconds()), 3)
        if self.output is None or self.output.last_commit_ts is None:
            return None
        return round((self.checked_at - self.output.last_commit_ts).total_seconds(), 3)

    @property
    def position(self) -> str | None:
        """The output's high-water mark against the slot's confirmed position (see the module doc)."""
        if self.output is None:
            return None
        if self.verdict is not None:
            return self.verdict.position
        hwm, confirmed = self.output.high_water_mark, self.info.confirmed_flush_lsn
        if hwm is None:
            return "no_commits"
        if confirmed is None or confirmed < hwm:
            return "slot_behind_output"
        return "in_sync" if confirmed == hwm else SLOT_AHEAD

    @property
    def position_bytes(self) -> int | None:
        """``confirmed_flush_lsn - high_water_mark`` (negative: the slot is behind the output)."""
        hwm = self.verdict.output.high_water_mark if self.verdict is not None else (
            self.output.high_water_mark if self.output is not None else None)
        confirmed = self.verdict.slot.confirmed_flush_lsn if self.verdict is not None else self.info.confirmed_flush_lsn
        if self.output is None or hwm is None or confirmed is None:
            return None
        return int(confirmed) - int(hwm)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the slot's fields, the lag, the output's position and the alerts."""
        out: dict[str, Any] = {
            "slot": self.info.name,
            "plugin": self.info.plugin,
            "database": self.info.database,
            "active": self.info.active,
            "active_pid": self.info.active_pid,
            "wal_status": self.info.wal_status,
            "safe_wal_size": self.info.safe_wal_size,
            "restart_lsn": _text(self.info.restart_lsn),
            "confirmed_flush_lsn": _text(self.info.confirmed_flush_lsn),
            "current_lsn": str(self.current_lsn),
            "lag_bytes": self.info.lag_bytes,
            "lag_seconds": self.lag_seconds,
            "lag_basis": self.lag_basis,
            "checked_at": self.checked_at.isoformat(),
            "alerts": list(self.alerts),
            # PostgreSQL 17+ (16: conflicting only); None where the server has no such column
            "failover": self.info.failover,
            "synced": self.info.synced,
            "sync_ready": self.info.sync_ready,
            "invalidation_reason": self.info.invalidation_reason,
            "conflicting": self.info.conflicting,
        }
        if self.output is not None:
            out.update({
                "output": self.output.output,
                "output_records": self.output.records,
                "output_rows": self.output.rows,
                "high_water_mark": _text(self.output.high_water_mark),
                "last_commit_ts": self.output.last_commit_ts.isoformat() if self.output.last_commit_ts else None,
                "last_committed_at": self.output.last_committed_at.isoformat() if self.output.last_committed_at else None,
                "position": self.position,
                "position_bytes": self.position_bytes,
            })
        return out


@dataclass(frozen=True)
class StatusReport:
    """The status of every slot looked at, and the threshold it was judged by."""

    database: str
    slots: tuple[SlotStatus, ...]
    max_lag_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def lost(self) -> tuple[SlotStatus, ...]:
        """Slots that lost the WAL they need (``wal_status = lost``)."""
        return tuple(s for s in self.slots if LOST in s.alerts)

    @property
    def gaps(self) -> tuple[SlotStatus, ...]:
        """Slots that ``ingest`` would refuse against the output (a gap, another server or timeline)."""
        return tuple(s for s in self.slots if s.verdict is not None and s.verdict.error is not None)

    @property
    def lagging(self) -> tuple[SlotStatus, ...]:
        """Slots whose lag in bytes is above ``max_lag_bytes``."""
        return tuple(s for s in self.slots if LAG in s.alerts)


def _text(lsn: Lsn | None) -> str | None:
    return str(lsn) if lsn is not None else None


def _alerts(info: SlotInfo, max_lag_bytes: int | None, position: str | None) -> tuple[str, ...]:
    found: list[str] = []
    if info.wal_status == "lost":
        found.append(LOST)
    elif info.wal_status == "unreserved":
        found.append(UNRESERVED)
    if max_lag_bytes is not None and info.lag_bytes is not None and info.lag_bytes > max_lag_bytes:
        found.append(LAG)
    if position in GAP_POSITIONS:
        found.append(position)
    return tuple(found)


def _output_slot(output: CommitLogSummary, slot: str | None) -> str:
    """The slot whose output this is: ``slot`` when given, else the one the commit log names."""
    if slot is not None:
        return slot
    if not output.slots:
        raise ConfigError(
            f"the output {output.output} has no commit-log record that names its slot",
            "pass --slot NAME together with --output",
        )
    if len(output.slots) > 1:
        raise ConfigError(
            f"the output {output.output} was fed by several slots ({', '.join(output.slots)})",
            "pass --slot NAME to say which one to compare it with",
        )
    return output.slots[0]


def collect_status(
    target: ConnectionTarget,
    *,
    slot: str | None = None,
    output: str | None = None,
    max_lag_bytes: int | None = None,
) -> StatusReport:
    """The status of the database's logical slots, or of ``slot``, or of the slot feeding ``output``.

    With ``output`` the report covers the slot that feeds it (``slot``, or the
    one its commit log names) and compares the two positions. Raises
    :class:`pgpoll.errors.SlotNotFoundError` for a named slot that does not
    exist, :class:`pgpoll.errors.SinkError` when the output cannot be read.
    """
    if output is not None:
        check_readable(open_output(output))  # an unreachable store, a wrong secret: exit 5 in seconds
    commit_log = CommitLog(open_output(output)) if output is not None else None  # its records read once
    log_summary = summarize(output, commit_log=commit_log) if output is not None else None
    wanted = _output_slot(log_summary, slot) if log_summary is not None else slot
    notes: list[str] = []
    if log_summary is not None and slot is not None and log_summary.slots and slot not in log_summary.slots:
        notes.append(f"the output's commit log names slot(s) {', '.join(log_summary.slots)}, not {slot}")
    caught_up = last_caught_up(output, commit_log) if output is not None else None
    conn = connect(target, application_name="pgpoll status")
    try:
        state = read_server_state(conn, wanted)
        counts = table_write_counts(conn, None) if caught_up is not None and not state.in_recovery else None
        verdicts = {info.name: _verdict(conn, info, output) for info in state.slots} if output is not None else {}
    finally:
        conn.close()
    statuses = []
    for info in state.slots:
        base = SlotStatus(info=info, current_lsn=state.current_lsn, checked_at=state.server_time, output=log_summary,
                          caught_up=caught_up, current_counts=counts, verdict=verdicts.get(info.name))
        statuses.append(replace(base, alerts=_alerts(info, max_lag_bytes, base.position)))
    return StatusReport(database=state.database, slots=tuple(statuses), max_lag_bytes=max_lag_bytes, notes=tuple(notes))


def _verdict(conn: Any, first: SlotInfo, output: str) -> Verdict:
    """The gap check of ``first`` (the slot as the report read it) against ``output``'s head, read after it."""
    log = CommitLog(open_output(output))
    reads = iter([first])

    def slot() -> SlotInfo:  # the report's reading first; a re-check reads the slot again
        return next(reads, None) or get_slot(conn, first.name)

    def head() -> OutputHead:
        hwm, record = output_head(log)
        return OutputHead(hwm, ServerIdentity.from_json(record.server) if record is not None else None)

    return check_slot_gap(slot, head, output_path=output, identity=lambda: read_identity(conn),
                          history=lambda timeline: read_timeline_history(conn, timeline))
