"""Where things live under an output path, and how partitions are named.

``PATH/changes/lsn_range=<start>-<end>/part-*.parquet``: one partition per
committed batch; ``start`` and ``end`` are the smallest and largest
``commit_lsn`` in it, as 16-digit zero-padded upper-case hex, so the names
sort in LSN order. ``PATH/_pgpoll/`` holds pgpoll's own files (readers skip
names that start with ``_``): ``commits/`` (the commit log), ``staging/``
(batches being written), ``rejects/`` (rows that could not be decoded).
"""

from __future__ import annotations

import re
from typing import Optional

from pgpoll.lsn import Lsn

CHANGES = "changes"
META = "_pgpoll"
COMMITS = f"{META}/commits"
STAGING = f"{META}/staging"
REJECTS = f"{META}/rejects"
MANIFEST = "_manifest.json"

_PARTITION = re.compile(r"^lsn_range=([0-9A-F]{16})-([0-9A-F]{16})$")


def partition_name(start: int, end: int) -> str:
    """``lsn_range=<start>-<end>`` with padded hex LSNs."""
    return f"lsn_range={Lsn(start).padded()}-{Lsn(end).padded()}"


def parse_partition_name(name: str) -> Optional[tuple[Lsn, Lsn]]:
    """``(start, end)`` of a partition directory name, or None when it is not one."""
    m = _PARTITION.match(name)
    if not m:
        return None
    return Lsn(int(m.group(1), 16)), Lsn(int(m.group(2), 16))


def commit_record_name(end: int) -> str:
    """The commit-log file name of the batch that ends at ``end``."""
    return f"{Lsn(end).padded()}.json"
