"""What each job's run reads and writes, as lineage datasets: read from the output and, for ingest, the catalog.

The columns come from the output's column ledgers (``_pgpoll/tables/<table>.json``, written with
``--typed-tables`` and by snapshots): each source column's name and PostgreSQL type, and the name it is
stored under in the typed table. So:

* ``ingest`` reads the captured tables (the publications' tables from ``pg_publication_tables`` with
  pgoutput, and every table the output has seen) and writes the change log (``<output>/changes``) and,
  with ``--typed-tables``, one typed table per source table (``<output>/tables/<schema>.<table>``), each
  typed column copied from its source column;
* ``snapshot`` reads the tables it snapshots and writes each one's snapshot area
  (``<output>/snapshots/<schema>.<table>``; the snapshot id is in the run's summary, not in the name, so
  that the dataset is the same from one snapshot to the next);
* ``materialize`` reads the typed tables and writes each state table (its path as the run reports it),
  each state column copied from the typed column(s) of the same source column.

A description that cannot be read (an output not created yet, a catalog the role cannot read) gives
fewer datasets, never a failed run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pgpoll.errors import PgpollError
from pgpoll.observe.lineage_events import Column, DatasetRef
from pgpoll.observe.lineage_names import ServerName, join, location, server_name
from pgpoll.sink import layout
from pgpoll.typed.rows import ColumnLedger, LedgerEntry

log = logging.getLogger("pgpoll.observe")


class HasOutput(Protocol):
    """What every job's options have."""

    output: str


def source_dsn(opts: Any) -> str:
    """The DSN the run connects with, as given (``--dsn``, else ``PGPOLL_DSN``; libpq's variables otherwise)."""
    return str(getattr(opts, "dsn", None) or os.environ.get("PGPOLL_DSN") or "")


def read_ledgers(output: str) -> dict[tuple[str, str], list[LedgerEntry]]:
    """Every table's column ledger at ``output``, by ``(schema, table)`` (empty where there is none)."""
    from pgpoll.sink.stores.filesystem import needs_spark, open_output

    if needs_spark(output):  # a Hadoop filesystem: not opened for lineage alone (it needs a JVM)
        return {}
    import json

    try:
        fs = open_output(output)
        found: dict[tuple[str, str], list[LedgerEntry]] = {}
        for name, is_dir, _size in fs.list(fs.path(layout.LEDGERS)):
            base = name.rstrip("/").rsplit("/", 1)[-1]
            parsed = layout.parse_table_dir_name(base.removesuffix(".json")) if base.endswith(".json") else None
            if is_dir or parsed is None:
                continue
            ledger = ColumnLedger.from_json(json.loads(fs.read_text(fs.path(layout.LEDGERS, base))))
            found[parsed] = list(ledger.entries)
        return found
    except (PgpollError, OSError, ValueError, KeyError) as exc:
        log.debug("lineage: no column ledgers read at the output: %s", exc)
        return {}


def _published_tables(dsn: str, publications: Sequence[str], cache: dict[str, Any]) -> list[tuple[str, str]]:
    """The publications' tables, read once per run on a short connection of its own (lineage only; errors give
    none, and a server that does not answer costs one short connect timeout, not one per event)."""
    if not publications:
        return []
    if "published" not in cache:
        cache["published"] = _read_published(dsn, publications)
    return list(cache["published"])


def _read_published(dsn: str, publications: Sequence[str]) -> list[tuple[str, str]]:
    from pgpoll.source.connection import connect, resolve_dsn
    from pgpoll.source.server_state import captured_tables

    try:
        conn = connect(resolve_dsn(dsn or None), application_name="pgpoll-lineage", connect_timeout=5)
        try:
            return captured_tables(conn, list(publications))
        finally:
            conn.close()
    except PgpollError as exc:
        log.debug("lineage: the publications' tables could not be read: %s", exc.message)
        return []


def _source_columns(entries: Sequence[LedgerEntry]) -> tuple[Column, ...]:
    """A source table's columns, each once (a column whose type changed keeps its latest type)."""
    latest: dict[str, str] = {}
    for e in entries:
        latest[e.name] = e.type.declared
    return tuple(Column(name, declared) for name, declared in latest.items())


def _source(server: ServerName, key: tuple[str, str], ledgers: Mapping[tuple[str, str], list[LedgerEntry]]) -> DatasetRef:
    return DatasetRef(server.namespace, server.table(*key), _source_columns(ledgers.get(key, [])))


def _typed(output: str, server: ServerName | None, key: tuple[str, str], entries: Sequence[LedgerEntry]) -> DatasetRef:
    """A typed table: each stored column copied from its source column (when the source is known)."""
    namespace, name = join(location(output), layout.TABLES, layout.table_dir_name(*key))
    columns = tuple(
        Column(e.physical, e.ddl, ((server.namespace, server.table(*key), e.name),) if server is not None else ())
        for e in entries
    )
    return DatasetRef(namespace, name, columns)


def ingest_datasets(
    opts: Any, summary: Any | None, cache: dict[str, Any],
) -> tuple[tuple[DatasetRef, ...], tuple[DatasetRef, ...]]:
    """An ingest run's inputs and outputs (``summary``: the run's, once it has ended)."""
    server = server_name(source_dsn(opts))
    ledgers = read_ledgers(opts.output)
    keys = sorted(set(ledgers) | set(_published_tables(source_dsn(opts), tuple(getattr(opts, "publications", ())), cache)))
    inputs = tuple(_source(server, key, ledgers) for key in keys)
    namespace, name = join(location(opts.output), layout.CHANGES)
    changes = DatasetRef(namespace, name, rows=getattr(summary, "changes", None), size=getattr(summary, "bytes", None))
    typed = tuple(_typed(opts.output, server, key, ledgers[key]) for key in sorted(ledgers)) if opts.typed_tables else ()
    return inputs, (changes, *typed)


def snapshot_datasets(
    opts: Any, summary: Any | None, cache: dict[str, Any],
) -> tuple[tuple[DatasetRef, ...], tuple[DatasetRef, ...]]:
    """A snapshot run's inputs (the snapshotted tables) and outputs (each table's snapshot area)."""
    server = server_name(source_dsn(opts))
    ledgers = read_ledgers(opts.output)
    names = list(getattr(summary, "table_names", None) or [])
    keys = sorted({tuple(n.split(".", 1)) for n in names if "." in n}) if names else sorted(
        set(_published_tables(source_dsn(opts), tuple(getattr(opts, "publications", ())), cache)))
    inputs = tuple(_source(server, (k[0], k[1]), ledgers) for k in keys)
    outputs = []
    for schema, table in keys:
        namespace, name = join(location(opts.output), layout.SNAPSHOTS, layout.table_dir_name(schema, table))
        source = server.table(schema, table)
        columns = tuple(Column(c.name, c.type, ((server.namespace, source, c.name),)) for c in _source_columns(
            ledgers.get((schema, table), [])))
        outputs.append(DatasetRef(namespace, name, columns))
    return inputs, tuple(outputs)


def materialize_datasets(
    opts: Any, results: Sequence[Any] | None, cache: dict[str, Any],
) -> tuple[tuple[DatasetRef, ...], tuple[DatasetRef, ...]]:
    """A materialize run's inputs (the typed tables) and outputs (each state table it reports)."""
    ledgers = read_ledgers(opts.output)
    typed = {key: _typed(opts.output, None, key, entries) for key, entries in sorted(ledgers.items())}
    outputs = []
    for state in results or ():
        key = tuple(str(state.table).split(".", 1))
        if len(key) != 2 or not getattr(state, "path", None):
            continue
        entries = ledgers.get((key[0], key[1]), [])
        source = typed.get((key[0], key[1]))
        namespace, name = location(str(state.path))
        by_name: dict[str, list[str]] = {}
        types: dict[str, str] = {}
        for e in entries:
            by_name.setdefault(e.name, []).append(e.physical)
            types[e.name] = e.ddl  # the state holds a column's latest type
        columns = tuple(
            Column(column, types[column],
                   tuple((source.namespace, source.name, p) for p in physical) if source is not None else ())
            for column, physical in by_name.items()
        )
        outputs.append(DatasetRef(namespace, name, columns, rows=getattr(state, "rows", None)))
    return tuple(typed.values()), tuple(outputs)
