"""What the driver engine needs of the materialize run it works for, as a Protocol.

:mod:`pgpoll.materialize.driver.run` decides whether a table is computed in
the driver and computes it there, asking the run for its engine, its output
and destination, the schema store, the state's shape and the previous state.
:class:`pgpoll.materialize.run.Materializer` (and the Delta and Iceberg ones
built on it) provide these; the run imports the driver engine, so the engine
names what it uses here instead of importing the run back.
"""

from __future__ import annotations

from typing import Any, Protocol

from pgpoll.materialize.change_summary import ChangeSummary
from pgpoll.materialize.state import StateColumn
from pgpoll.sink.stores.output_fs import OutputFs
from pgpoll.sink.typed_tables import SchemaStore
from pgpoll.typed.schemas import TableSchema


class DriverHost(Protocol):
    """The part of a materialize run that :mod:`pgpoll.materialize.driver.run` reads and fills in."""

    engine: str
    """``PGPOLL_MATERIALIZE_ENGINE``: ``auto``, ``spark`` or ``driver``."""
    fs: OutputFs
    """The output the changes are read from."""
    dest: OutputFs
    """Where the state is written."""
    store: SchemaStore
    """The output's table shapes by id."""
    summaries: dict[str, ChangeSummary]
    """Per table: what one pass over its new changes found (filled in for the state's write)."""
    row_bounds: dict[str, int]
    """Per table built without a previous state: at most this many rows (filled in likewise)."""
    read_after: dict[str, int]
    """Per table: only changes past this ``commit_lsn`` are new (a merge of ``pgpoll compact`` holds older ones too)."""

    def describe(self, parsed: tuple[str, str], summary: ChangeSummary, marker: dict[str, Any] | None,
                 floor: tuple[tuple[int, int], TableSchema] | None, shape: TableSchema | None,
                 ) -> tuple[TableSchema, list[StateColumn], list[str], list[str]]:
        """The state's description, columns, key (state names) and warnings."""
        ...

    def driver_previous(self, name: str, events: Any, key: list[str], columns: list[StateColumn],
                        schema: Any) -> tuple[Any, str | None]:
        """The previous state as an Arrow table read in the driver, or why it is left to Spark."""
        ...
