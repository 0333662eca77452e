"""Reading a Delta table pgpoll wrote (the change log, a materialized state) into Arrow, safely, on any store.

delta-rs resolves the version (its log, its checkpoint) and lists the data
files with their partition values; pyarrow reads the files through pgpoll's
own store client. Not ``DeltaTable.to_pyarrow_table()``: with deltalake 1.6
a process that scanned a table through delta-rs's pyarrow dataset can abort
at interpreter exit (``terminate called without an active exception``,
exit 134; seen in about one run in six here, on local tables too), while
listing files and reading them with pyarrow never does.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pgpoll.errors import SinkError, first_line
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.sink.stores.local_files import local_path
from pgpoll.sink.stores.output_fs import OutputFs


def open_delta(fs: OutputFs, version: int | None = None) -> Any:
    """The ``deltalake.DeltaTable`` at ``fs``'s root (its newest version, or ``version``)."""
    from deltalake import DeltaTable

    location = getattr(fs, "location", None)
    uri = local_path(fs.root) or fs.root
    options = location.delta_options() if location is not None else None
    try:
        return DeltaTable(uri, version=version, storage_options=options)
    except Exception as exc:
        raise SinkError(f"cannot read the Delta table {fs.root}: {first_line(exc)}",
                        "check the path (it must hold a _delta_log/) and that the store is reachable") from None


def delta_files(fs: OutputFs, version: int | None = None) -> list[tuple[str, dict[str, str | None]]]:
    """``(path of fs, partition values)`` of every data file of the table's version."""
    table = open_delta(fs, version)
    actions = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    out: list[tuple[str, dict[str, str | None]]] = []
    for action in actions:
        path = str(action["path"])
        values = {k: (None if v is None else str(v)) for k, v in dict(action.get("partition") or {}).items()}
        out.append((path if "://" in path or path.startswith("/") else fs.path(path), values))
    return sorted(out)


def read_delta(path: str, version: int | None = None, fs: OutputFs | None = None) -> pa.Table:
    """Every row of the Delta table at ``path`` (partition columns appended as strings), read with pyarrow."""
    fs = fs or open_output(path)
    arrow = fs.arrow()
    declared = pa.schema(open_delta(fs, version).schema().to_arrow())
    tables: list[pa.Table] = []
    for file, values in delta_files(fs, version):
        table = pq.read_table(fs.arrow_path(file), filesystem=arrow)
        for name, value in sorted(values.items()):
            table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
        tables.append(table)
    if not tables:
        return declared.empty_table()
    read = pa.concat_tables(tables, promote_options="permissive")
    # the columns' metadata as the Delta schema declares it (pgpoll.name: a column's PostgreSQL name)
    fields = []
    for f in read.schema:
        meta: dict[Any, Any] | None = declared.field(f.name).metadata if f.name in declared.names else None
        fields.append(f.with_metadata(meta) if meta else f)
    schema_meta: dict[Any, Any] | None = read.schema.metadata
    return pa.Table.from_arrays(read.columns, schema=pa.schema(fields, metadata=schema_meta))
