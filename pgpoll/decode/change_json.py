"""The change envelope: turning buffered changes into records, and records into JSON.

Used by :mod:`pgpoll.decode.assembler` (which re-exports
:func:`change_record_to_json`); no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pgpoll.changes import ChangeRecord, LogicalMessage, Op, RowChange, Truncate
from pgpoll.lsn import Lsn

__all__ = ["Change", "change_record_to_json", "iter_records", "records_for"]

#: An event that becomes one or more records.
Change = RowChange | Truncate | LogicalMessage


def records_for(
    changes: Iterable[Change],
    commit_lsn: int | None,
    xid: int | None,
    commit_ts: datetime | None,
) -> list[ChangeRecord]:
    """Envelopes for ``changes`` in order, numbered from seq 0."""
    return list(iter_records(changes, commit_lsn, xid, commit_ts))


def iter_records(
    changes: Iterable[Change],
    commit_lsn: int | None,
    xid: int | None,
    commit_ts: datetime | None,
) -> Iterator[ChangeRecord]:
    """Like :func:`records_for`, one record at a time (for transactions too large to hold)."""
    seq = 0
    for ch in changes:
        if isinstance(ch, RowChange):
            yield (
                ChangeRecord(
                    commit_lsn,
                    ch.lsn,
                    seq,
                    xid,
                    commit_ts,
                    ch.op,
                    ch.schema,
                    ch.table,
                    ch.before,
                    ch.after,
                    ch.unchanged_toast,
                )
            )
            seq += 1
        elif isinstance(ch, Truncate):
            for schema, table in ch.relations:
                yield (
                    ChangeRecord(
                        commit_lsn, ch.lsn, seq, xid, commit_ts, Op.TRUNCATE, schema, table
                    )
                )
                seq += 1
        else:
            yield (
                ChangeRecord(
                    commit_lsn,
                    ch.lsn,
                    seq,
                    xid,
                    commit_ts,
                    Op.MESSAGE,
                    message_prefix=ch.prefix,
                    message_content=ch.content,
                    transactional=ch.transactional,
                )
            )
            seq += 1


def _lsn_json(value: int | None) -> str | None:
    return None if value is None else str(Lsn(value))


def change_record_to_json(record: ChangeRecord) -> dict[str, Any]:
    """The envelope as JSON-ready values.

    LSNs print as PostgreSQL does (``"0/16B1970"``), ``commit_ts`` as
    ISO-8601 UTC with microseconds (``"2026-11-22T01:53:54.095995Z"``; a naive
    value is taken as UTC), ``op`` as its letter and ``message_content`` as
    base64; absent values are None.
    """
    ts = record.commit_ts
    if ts is not None:
        ts_text: str | None = (
            (ts if ts.tzinfo is None else ts.astimezone(UTC)).strftime(
                "%Y-%m-%dT%H:%M:%S.%f"
            )
            + "Z"
        )
    else:
        ts_text = None
    content = record.message_content
    return {
        "commit_lsn": _lsn_json(record.commit_lsn),
        "lsn": _lsn_json(record.lsn),
        "seq": record.seq,
        "xid": record.xid,
        "commit_ts": ts_text,
        "op": record.op.value,
        "schema_name": record.schema_name,
        "table_name": record.table_name,
        "before": dict(record.before) if record.before is not None else None,
        "after": dict(record.after) if record.after is not None else None,
        "unchanged_toast": list(record.unchanged_toast),
        "message_prefix": record.message_prefix,
        "message_content": (
            base64.b64encode(content).decode("ascii") if content is not None else None
        ),
        "transactional": record.transactional,
    }
