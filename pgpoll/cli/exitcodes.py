"""pgpoll's documented exit codes, and the one place errors become them."""

from __future__ import annotations

from pgpoll.errors import ConfigError, DecodeError, SinkError, SlotBusyError, SourceError

OK = 0
UNEXPECTED = 1
USAGE = 2
SLOT_BUSY = 3
SOURCE = 4
SINK = 5
DECODE = 6
STATUS_ALERT = 7
INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2
TERMINATED = 143  # SIGTERM: 128 + 15

EXIT_CODES: dict[int, str] = {
    OK: "success (also: nothing to do)",
    UNEXPECTED: "unexpected error",
    USAGE: "usage or configuration error",
    SLOT_BUSY: (
        "busy: another consumer or pgpoll run holds the slot, the output or the destination "
        "(the refused step changed nothing)"
    ),
    SOURCE: (
        "source precondition failed (missing slot or publication, wrong plugin, wal_level, privileges, invalidated "
        "slot, a slot moved past the output or on another history, a wait on synchronized_standby_slots cancelled)"
    ),
    SINK: "sink error: output not writable or commit failed",
    DECODE: "decode error: plugin output could not be parsed",
    STATUS_ALERT: "status alert: lag above --max-lag-bytes",
    INTERRUPTED: "interrupted by SIGINT (Ctrl-C): stopped at a safe point, committed batches kept",
    TERMINATED: "terminated by SIGTERM: stopped at a safe point, committed batches kept",
}


def exit_code_for(error: BaseException) -> int:
    """The exit code for an error (1 for anything that is not a PgpollError)."""
    if isinstance(error, ConfigError):
        return USAGE
    if isinstance(error, SlotBusyError):
        return SLOT_BUSY
    if isinstance(error, SourceError):
        return SOURCE
    if isinstance(error, SinkError):
        return SINK
    if isinstance(error, DecodeError):
        return DECODE
    return UNEXPECTED
