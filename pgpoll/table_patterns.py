"""Which tables a command takes: ``--tables`` / ``--exclude-tables`` shell patterns.

Name selection only — not to be confused with row filters (:mod:`pgpoll.rowfilter`),
which select rows by their values. Shared by ingest (which changes to write) and
materialize (which tables to build); pure, so it pickles to Spark executors.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True)
class TablePatterns:
    """Shell patterns over ``schema.table`` (or the bare table name) to include and exclude."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def accepts(self, schema: str | None, table: str | None) -> bool:
        """True when ``schema.table`` is selected (always true for a change without a table)."""
        if table is None or not (self.include or self.exclude):
            return True
        name = f"{schema}.{table}"
        if self.include and not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(table, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(table, p) for p in self.exclude)
