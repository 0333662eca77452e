"""Spark adapters: the SparkSession factory and its quiet logging, and ``format("pgpoll")``.

``import pgpoll.spark; pgpoll.spark.register(spark)`` makes
``spark.read.format("pgpoll")`` and ``spark.readStream.format("pgpoll")``
known to ``spark`` (Spark 4.2+; see :mod:`pgpoll.spark.registration`).
Importing this package imports nothing of Spark: the jobs import its
session factory without the data source.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register ``format("pgpoll")`` with ``spark``; :class:`~pgpoll.errors.ConfigError` on Spark below 4.2."""
    from pgpoll.spark.registration import register_source

    register_source(spark)
