"""``pgpoll.spark.register(spark)``: make ``format("pgpoll")`` known to a SparkSession, on a Spark that can run it.

The stream needs what Spark 4.2 added to Python data sources: admission
control (``latestOffset(start, limit)``, ``ReadMaxRows``, ``ReadMaxBytes``)
and ``SupportsTriggerAvailableNow`` (SPARK-55304). On 4.0 and 4.1 a Python
stream gets neither, and ``Trigger.AvailableNow`` silently runs one batch;
rather than run differently there, registration refuses with the version
needed. Both sides count: the JVM's Spark (``spark.version``) and the
PySpark that runs the source's Python (``pyspark.__version__``).

What makes the stream use them (PySpark 4.3): ``check_support_func`` in
``pyspark/sql/streaming/python_streaming_source_runner.py`` reports admission
control when ``latestOffset`` takes ``(start, limit)`` and Trigger.AvailableNow
when the reader subclasses ``SupportsTriggerAvailableNow``; the JVM then wraps
the reader as ``PythonMicroBatchStreamWithTriggerAvailableNow`` (a
``SupportsTriggerAvailableNow``, so ``MicroBatchExecution`` runs
``availableNow`` in several batches and calls ``prepareForTriggerAvailableNow``).

Spark prints a stream's options in its plans (``StreamingRelationV2 ...
[dsn=..., slot=...]`` in ``explain`` and in a failed query's message),
redacting the values of options whose name matches
``spark.sql.redaction.options.regex`` (default ``(?i)url``). Registration
adds ``dsn`` to that pattern, so a DSN given as an option (it may carry a
password) shows as ``*********(redacted)``.
"""

from __future__ import annotations

import re
from typing import Any

from pgpoll.errors import ConfigError

__all__ = ["MIN_SPARK", "REDACTION_CONF", "check_versions", "redaction_pattern", "register_source", "spark_version",
           "supported"]

MIN_SPARK = (4, 2)
REDACTION_CONF = "spark.sql.redaction.options.regex"


def spark_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a Spark version string (``4.3.0``, ``4.2.0-SNAPSHOT``); (0, 0) when unreadable."""
    found = re.match(r"^\s*(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def supported(version: str) -> bool:
    """True when a Spark of ``version`` can run pgpoll's data source."""
    return spark_version(version) >= MIN_SPARK


def check_versions(spark_version_text: str, pyspark_version_text: str) -> None:
    """Refuse a Spark or PySpark below :data:`MIN_SPARK`, naming the version needed."""
    needed = ".".join(map(str, MIN_SPARK))
    for what, version in (("Spark", spark_version_text), ("PySpark", pyspark_version_text)):
        if not supported(version):
            raise ConfigError(
                f'format("pgpoll") needs Spark {needed} or newer; this {what} is {version}',
                f"upgrade Spark and PySpark to {needed}+ (pip install 'pyspark>={needed}'), or run pgpoll ingest "
                "(jobs/ingest.py), which runs on Spark 4.0+",
            )


def redaction_pattern(current: str) -> str:
    """``current`` (Spark's option-redaction regex) widened to match ``dsn`` (unchanged when it does already)."""
    if not current:
        return "(?i:dsn)"
    try:
        if re.search(current, "dsn"):
            return current
    except re.error:  # a Java-only construct: widen it anyway
        pass
    return f"{current}|(?i:dsn)"


def register_source(spark: Any) -> None:
    """Register :class:`pgpoll.spark.data_source.PgpollDataSource` as ``pgpoll`` with ``spark``; redact ``dsn``."""
    import pyspark

    check_versions(str(spark.version), str(pyspark.__version__))
    from pgpoll.spark.data_source import PgpollDataSource

    spark.dataSource.register(PgpollDataSource)
    current = str(spark.conf.get(REDACTION_CONF, "(?i)url"))
    wider = redaction_pattern(current)
    if wider != current:
        spark.conf.set(REDACTION_CONF, wider)
