"""Small tables materialized in the driver: when, and the files read and written there with pyarrow.

A Spark job costs a fraction of a second once the JVM is warm and seconds
before, and a table's run takes several (read with schema merging, the
change summary, the state's shuffle, the write): five tables of 1,000 rows
took some 15 s on top of Spark's start-up. A table whose new changes and
previous state are small (at most :data:`DRIVER_ROWS` rows each) and whose
output and DEST are local (and whose files are at most :data:`DRIVER_BYTES`)
is computed in the driver instead
(:mod:`pgpoll.materialize.driver.state`): its changes are read with pyarrow,
replayed, and the state written with pyarrow, then published exactly as a
Spark-written state (the same state record or Delta commit). Tables on a
snapshot, whose replica identity changed, or with values stored under an
older type go to Spark, as do larger changes. A large previous state goes
to Spark too, except a Delta one with an integer or string key: then only
the files that may hold a key the changes touch are read, replayed over and
rewritten (:mod:`pgpoll.materialize.driver.files`), the usual incremental
run of a big table (new keys and updates of recent rows).

``PGPOLL_MATERIALIZE_ENGINE`` chooses: ``auto`` (the default: as above),
``spark`` (every table with Spark), ``driver`` (every table the replay covers,
whatever its size).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pgpoll.errors import ConfigError
from pgpoll.materialize.change_summary import ChangeSummary, identity_segments
from pgpoll.materialize.driver.host import DriverHost
from pgpoll.materialize.driver.state import DRIVER_BYTES, DRIVER_ROWS, decline, predates, replay, summarize_table
from pgpoll.materialize.snapshot_merge import predates_text
from pgpoll.materialize.state import ComputedState, StateColumn
from pgpoll.sink.commit.log import CommitRecord
from pgpoll.sink.parquet_writer import WRITE_OPTIONS
from pgpoll.sink.stores.filesystem import local_path
from pgpoll.sink.stores.output_fs import OutputFs
from pgpoll.typed.mapping import arrow_type

log = logging.getLogger("pgpoll.materialize")
ENGINE_ENV = "PGPOLL_MATERIALIZE_ENGINE"
ENGINES = ("auto", "spark", "driver")
_TS = pa.timestamp("us", tz="UTC")


def requested_engine(environ: dict[str, str] | None = None) -> str:
    """``PGPOLL_MATERIALIZE_ENGINE`` (default ``auto``); any other value is a ConfigError (exit 2)."""
    value = (environ if environ is not None else dict(os.environ)).get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if value not in ENGINES:
        raise ConfigError(f"{ENGINE_ENV}={value!r} is not one of {', '.join(ENGINES)}",
                          f"unset {ENGINE_ENV} (auto: small tables of a local output in the driver, the rest with Spark)")
    return value


def state_schema(columns: Sequence[StateColumn]) -> pa.Schema:
    """The Arrow schema of a state with ``columns``, as Spark writes it (every field nullable)."""
    return pa.schema([
        *[pa.field(c.name, arrow_type(c.type)) for c in columns],
        pa.field("_untyped", pa.map_(pa.string(), pa.string())),
        pa.field("_commit_lsn", pa.int64()),
        pa.field("_commit_ts", _TS),
    ])


def reaches(fs: OutputFs) -> bool:
    """Whether the driver reads and writes ``fs`` with pyarrow itself (a local path or an object store)."""
    return local_path(fs.root) is not None or fs.direct_writes


def arrow_of(fs: OutputFs | None) -> tuple[pafs.FileSystem, Any]:
    """A pyarrow filesystem and the path mapping for ``fs`` (None: local OS paths)."""
    if fs is None:
        return pafs.LocalFileSystem(), lambda path: local_path(path) or path
    return fs.arrow(), fs.arrow_path


def in_driver(m: DriverHost, name: str, read: Sequence[CommitRecord], marker: dict[str, Any] | None,
              files: Sequence[tuple[str, int]]) -> bool:
    """Whether this table's run is computed in the driver (see the module docstring); ``files``: its new
    changes' files with their sizes."""
    if m.engine == "spark":
        return False
    if not reaches(m.dest) or not reaches(m.fs):
        return False
    if m.engine == "driver":
        return True
    # wide rows or large values (TOAST) make few rows many bytes: bound what the driver reads too
    # (the previous state is bounded where it is read: Materializer.driver_previous)
    return sum(r.rows for r in read) <= DRIVER_ROWS and sum(size for _path, size in files) <= DRIVER_BYTES


def small_files(paths: Sequence[str], fs: OutputFs | None = None) -> bool:
    """Whether Parquet files hold at most :data:`DRIVER_ROWS` rows and :data:`DRIVER_BYTES` bytes (footers read)."""
    arrow, where = arrow_of(fs)
    rows = size = 0
    for path in paths:
        meta = pq.read_metadata(where(path), filesystem=arrow)
        rows += meta.num_rows
        size += int(arrow.get_file_info(where(path)).size or 0)
    return rows <= DRIVER_ROWS and size <= DRIVER_BYTES


def parquet_files(directory: str) -> list[str]:
    """The data files of a local directory Spark or pyarrow wrote (names starting with ``_`` or ``.`` aside)."""
    if not directory or not os.path.isdir(directory):
        return []
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))
            if n.endswith(".parquet") and not n.startswith(("_", "."))]


def read_parquet_files(paths: Sequence[str], fs: OutputFs | None = None) -> pa.Table | None:
    """The rows of ``paths`` (of ``fs``; None: local) as one table, schemas merged as Spark's ``mergeSchema``
    does (None: no file)."""
    arrow, where = arrow_of(fs)
    tables = [pq.read_table(where(p), filesystem=arrow) for p in paths]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def write_state_file(table: pa.Table, directory: str, rows_per_file: int | None = None,
                     fs: OutputFs | None = None) -> int:
    """Write ``table`` as Parquet into ``directory`` (of ``fs``; None: a local path, created): one file, or files
    of at most ``rows_per_file`` rows in order; returns the rows."""
    if fs is None and local_path(directory) is None:
        raise ConfigError(f"{directory} is not a local path", "materialize it with PGPOLL_MATERIALIZE_ENGINE=spark")
    arrow, where = arrow_of(fs)
    arrow.create_dir(where(directory), recursive=True)
    step = rows_per_file or max(table.num_rows, 1)
    run = uuid.uuid4()
    for n, start in enumerate(range(0, max(table.num_rows, 1), step)):
        pq.write_table(table.slice(start, step), where(f"{directory}/part-{n:05d}-{run}-c000.snappy.parquet"),
                       filesystem=arrow, **WRITE_OPTIONS)
    return table.num_rows


def arrow_stat_columns(schema: pa.Schema) -> set[str]:
    """The columns whose minimum and maximum Delta readers compare like Spark does (integers, strings, dates)."""
    return {f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_string(f.type)
            or pa.types.is_date32(f.type)}


def sorted_on(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """``table`` sorted on ``key`` where Arrow can sort those columns (the layout Spark's writer gives)."""
    if not key:
        return table
    try:
        return table.sort_by([(k, "ascending") for k in key])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return table


def driver_state(m: DriverHost, name: str, parsed: tuple[str, str], files: Sequence[tuple[str, int]],
                 marker: dict[str, Any] | None) -> ComputedState | None:
    """The table's new state computed in the driver, or None when the replay does not cover it (Spark does)."""
    qualified = f"{parsed[0]}.{parsed[1]}"
    events = read_parquet_files([path for path, _size in files], m.fs)
    if events is not None and name in m.read_after:  # a merge of pgpoll compact also holds changes the state has
        events = events.filter(pc.greater(events.column("_commit_lsn"), pa.scalar(m.read_after[name], pa.int64())))
    summary = summarize_table(events) if events is not None else ChangeSummary()
    if len(identity_segments(summary, m.store)) > 1:
        log.info("%s: the replica identity changed: computed with Spark", qualified)
        return None
    described, columns, key, warnings = m.describe(parsed, summary, marker, None, None)
    schema = state_schema(columns)
    previous, why = m.driver_previous(name, events, key, columns, schema) if marker else (None, None)
    why = why or decline(events, previous, columns, schema)
    if why is not None:
        log.info("%s: %s: computed with Spark", qualified, why)
        return None
    m.summaries[name] = summary
    key_physical = {c.name: c.physical[0] for c in columns if c.name in key and c.physical}
    if marker is None and key and summary.touches and events is not None and predates(events, key_physical):
        warnings.append(predates_text(qualified))
    if previous is None:
        m.row_bounds[name] = summary.row_changes
    table, unresolved = replay(events, previous, columns, key, schema)
    log.info("%s: computed in the driver (%d change rows)", qualified, 0 if events is None else events.num_rows)
    return ComputedState(described, key, warnings, unresolved, table=table)
