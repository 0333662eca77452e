"""``format("pgpoll")`` found by Spark's own lookup of Python data sources, without ``pgpoll.spark.register``.

Spark 4 registers every top-level module named ``pyspark_*`` on the Python
path that defines ``DefaultSource`` (``pyspark/sql/worker/lookup_data_sources.py``),
once per application, when a Python data source is first used. Explicit
``pgpoll.spark.register(spark)`` stays the documented way: it also refuses
a Spark below 4.2 with a clear error. Here nothing may raise (an error
would break the lookup of every Python data source of the application), so
on a PySpark below 4.2, or without pgpoll's dependencies, this module
defines nothing.
"""

from __future__ import annotations

try:
    import pyspark

    from pgpoll.spark.registration import supported

    if supported(str(pyspark.__version__)):
        from pgpoll.spark.data_source import PgpollDataSource as DefaultSource  # noqa: F401 (Spark looks it up)
except Exception:
    pass
