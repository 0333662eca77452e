"""pgpoll: batch change-data-capture from PostgreSQL logical replication slots into Parquet, on Spark."""

from __future__ import annotations

__version__ = "0.1.0"
