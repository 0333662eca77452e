"""A Spark application that drains slots with ``spark.readStream.format("pgpoll")``, as a scheduled job would.

Run as its own process by the tests (which SIGKILL it) and by the benchmark:

    python tests/spark/stream_job.py QUERY [QUERY ...]

each ``QUERY`` a JSON object: ``slot``, ``sink`` (``parquet`` or ``delta``),
``path``, ``checkpoint``, and optionally ``publication``, ``tables``,
``maxRowsPerTrigger``. Every query runs with ``trigger(availableNow=True)``;
the process exits 0 when all have finished. The DSN comes from
``PGPOLL_DSN``. A ``delta`` sink is a ``foreachBatch`` that appends each batch
with delta-rs under the application transaction ``(query id, batch id)``,
and skips a batch whose id the table already records: the README's
exactly-once recipe.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pyspark.sql import SparkSession


def delta_writer(path: str) -> Any:
    """The README's foreachBatch: append a batch once, keyed by the query's id and the batch id."""

    def write(frame: Any, batch_id: int) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        app = "pgpoll-stream:" + frame.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if DeltaTable.is_deltatable(path) and (DeltaTable(path).transaction_version(app) or -1) >= batch_id:
            return  # this batch is in the table already (the query died before it recorded the batch)
        write_deltalake(path, frame.toArrow(), mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(app, batch_id)]))

    return write


def main(queries: list[dict[str, Any]]) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").appName("pgpoll-stream-job")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import pgpoll.spark

    pgpoll.spark.register(spark)
    started = []
    for q in queries:
        reader = spark.readStream.format("pgpoll").option("slot", q["slot"])
        for name in ("publication", "tables", "maxRowsPerTrigger", "maxBytesPerTrigger"):
            if q.get(name):
                reader = reader.option(name, str(q[name]))
        writer = reader.load().writeStream.option("checkpointLocation", q["checkpoint"]).trigger(availableNow=True)
        if q["sink"] == "delta":
            writer = writer.foreachBatch(delta_writer(q["path"]))
        else:
            writer = writer.format("parquet").option("path", q["path"])
        started.append(writer.start())
    for query in started:
        query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main([json.loads(arg) for arg in sys.argv[1:]]))
