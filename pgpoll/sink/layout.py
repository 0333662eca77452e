"""Where things live under an output path, and how partitions are named.

``PATH/changes/lsn_range=<start>-<end>/part-*.parquet``: one partition per
committed batch; ``start`` and ``end`` are the smallest and largest
``commit_lsn`` in it, as 16-digit zero-padded upper-case hex, so the names
sort in LSN order. ``PATH/_pgpoll/`` holds pgpoll's own files (readers skip
names that start with ``_``): ``commits/`` and ``checkpoints/`` (the commit
log, :mod:`pgpoll.sink.commit.log`), ``staging/`` (batches being written:
``<id>.plan.json``, ``<id>/``, ``<id>-tables/``), ``unrecorded/`` (partitions
no record names, set aside by recovery), ``lease.json`` (the run holding the
output), ``rejects/`` (rows that could not be decoded), ``schemas/`` (table
shapes by id), ``tables/`` (each typed table's column ledger), ``compactions/``
and ``compactions-staging/`` (``pgpoll compact``'s fenced records and its merged
files before their record exists, :mod:`pgpoll.sink.commit.compactions`), ``runs/`` and
``runs.json`` (the run history: one record file per run, and their fold,
:mod:`pgpoll.observe.run_history`).

With ``--typed-tables``, ``PATH/tables/<schema>.<table>/lsn_range=.../`` holds
each table's typed changes of the same batch. In ``<schema>.<table>`` each
part keeps letters, digits, ``_`` and ``-`` and writes any other character
as ``%XX`` (its UTF-8 bytes), so a name with dots, slashes or glob
characters maps to one safe directory and back; a leading ``_`` of the schema
part is written as ``%5F`` too, so the directory is never hidden.

``pgpoll snapshot`` writes ``PATH/snapshots/<snapshot_id>/<schema>.<table>/chunk=<n>/``
(data; attempts under ``_attempts/`` beside the chunks) and
``PATH/_pgpoll/snapshots/<snapshot_id>/`` (``plan.json``, one
``<schema>.<table>/chunk-<n>.json`` manifest per finished chunk,
``complete.json``); each table it reads is guarded by a lease
``PATH/_pgpoll/leases/snapshot-<schema>.<table>.json``
(:mod:`pgpoll.sink.snapshot_store`). Ingest's recovery never looks there.
"""

from __future__ import annotations

import re

from pgpoll.lsn import Lsn

CHANGES = "changes"
TABLES = "tables"
STATE = "state"
META = "_pgpoll"
SCHEMAS = f"{META}/schemas"
LEDGERS = f"{META}/tables"
COMMITS = f"{META}/commits"
CHECKPOINTS = f"{META}/checkpoints"
STAGING = f"{META}/staging"
UNRECORDED = f"{META}/unrecorded"
LEASE = f"{META}/lease.json"
COMPACTIONS = f"{META}/compactions"
COMPACTION_STAGING = f"{META}/compactions-staging"
COMPACTION_LEASE = f"{META}/compact-lease.json"
RETAIN_LEASE = f"{META}/leases/retain.json"
PLAN_SUFFIX = ".plan.json"
TABLES_SUFFIX = "-tables"
REJECTS = f"{META}/rejects"
RUNS = f"{META}/runs"
RUNS_FOLDED = f"{META}/runs.json"
SNAPSHOTS = "snapshots"
SNAPSHOT_META = f"{META}/snapshots"
SNAPSHOT_LEASES = f"{META}/leases"
SNAPSHOT_PLAN = "plan.json"
SNAPSHOT_COMPLETE = "complete.json"
SNAPSHOT_ATTEMPTS = "_attempts"

_PARTITION = re.compile(r"^lsn_range=([0-9A-F]{16})-([0-9A-F]{16})$")


def partition_name(start: int, end: int) -> str:
    """``lsn_range=<start>-<end>`` with padded hex LSNs."""
    return f"lsn_range={Lsn(start).padded()}-{Lsn(end).padded()}"


def parse_partition_name(name: str) -> tuple[Lsn, Lsn] | None:
    """``(start, end)`` of a partition directory name, or None when it is not one."""
    m = _PARTITION.match(name)
    if not m:
        return None
    return Lsn(int(m.group(1), 16)), Lsn(int(m.group(2), 16))


def commit_record_name(end: int) -> str:
    """The commit-log file name of the batch that ends at ``end`` (format version 1; see :mod:`pgpoll.sink.commit.log`)."""
    return f"{Lsn(end).padded()}.json"


def _escape(part: str) -> str:
    out: list[str] = []
    for ch in part:
        if ch.isascii() and (ch.isalnum() or ch in "_-"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def table_dir_name(schema: str, table: str) -> str:
    """``<schema>.<table>`` with each part escaped (see the module docstring).

    A leading ``_`` of the schema part is escaped too (``%5F``): readers skip
    directories whose name starts with ``_`` as hidden.
    """
    escaped = _escape(schema)
    if escaped.startswith("_"):
        escaped = "%5F" + escaped[1:]
    return f"{escaped}.{_escape(table)}"


def parse_table_dir_name(name: str) -> tuple[str, str] | None:
    """``(schema, table)`` of a directory made by :func:`table_dir_name`, or None."""
    from urllib.parse import unquote

    if name.startswith(("_", ".")) or name.count(".") != 1:
        return None
    schema, table = name.split(".")
    try:
        return unquote(schema, errors="strict"), unquote(table, errors="strict")
    except UnicodeDecodeError:
        return None
