"""Every Arrow type of the mapping is readable by Spark from Parquet, as the type spark_ddl names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.testing.value_compare import comparable_lake
from pgpoll.typed.conversions import to_arrow
from pgpoll.typed.mapping import spark_ddl, type_from_name

# (type name, value texts): one column per Arrow type the mapping produces
COLUMNS: list[tuple[str, list[Any]]] = [
    ("boolean", ["true", None]),
    ("smallint", ["-32768", "32767"]),
    ("integer", ["2147483647", None]),
    ("bigint", ["-9223372036854775808", "1"]),
    ("real", ["1.1", "NaN"]),
    ("double precision", ["-Infinity", "0.1"]),
    ("numeric(10,2)", ["12345678.91", "NaN"]),
    ("numeric(38,0)", ["9" * 38, "-1"]),
    ("numeric(3,5)", ["0.00123", None]),
    ("numeric", ["NaN", "1.50"]),
    ("text", ["ünï", ""]),
    ("bytea", ["\\x00ff", "\\x"]),
    ("date", ["0001-01-01", "9999-12-31"]),
    ("time without time zone", ["24:00:00", "04:05:06.789"]),
    ("timestamp without time zone", ["0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"]),
    ("timestamp with time zone", ["2024-01-02 03:04:05.123456+00", "1900-01-01 00:00:00+00"]),
    ("interval", ["-1 years -2 mons +3 days -04:05:06.789", "2562047788:00:54.775807"]),
    ("integer[]", ["{1,NULL}", "{}"]),
    ("numeric(10,2)[]", ["{1.50,NULL}", None]),
    ("interval[]", ['{"1 day",-00:00:01}', None]),
    ("timestamp with time zone[]", ['{"2024-01-02 03:04:05+00"}', "{}"]),
    ("mood[]", ["{happy,NULL}", None]),
]


def test_spark_reads_every_mapped_type(spark: Any, tmp_path: Path) -> None:
    arrays, names = [], []
    for n, (name, texts) in enumerate(COLUMNS):
        arrays.append(to_arrow(type_from_name(name), texts)[0])
        names.append(f"c{n}")
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table(arrays, names=names), path)
    df = spark.read.parquet(str(path))
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    for n, (name, _texts) in enumerate(COLUMNS):
        assert fields[f"c{n}"] == spark_ddl(type_from_name(name)), name
    rows = df.collect()
    for n, (name, _texts) in enumerate(COLUMNS):
        t = type_from_name(name)
        for r, value in enumerate(arrays[n].to_pylist()):
            assert comparable_lake(rows[r][f"c{n}"], t) == comparable_lake(value, t), (name, r)
