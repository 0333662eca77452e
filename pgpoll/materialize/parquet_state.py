"""The Parquet state of a table (``--format parquet``): its marker, the previous state, publishing a new one.

The new state is written beside the old one (``DEST/<schema>.<table>.materializing-<seq>-<run>``:
not a name starting with ``_``, which Spark would treat as hidden), published
by creating the table's state record ``<seq>`` exclusively, and only then
swapped in: the old directory is renamed aside and the new one renamed into
place, so for that moment readers find no state; a crash after the record is
finished by the next run (:mod:`pgpoll.materialize.state_log`). A run that
outlived its lease and lost the record's compare-and-set to another exits 5,
having changed nothing.

:class:`ParquetState` holds the methods of :class:`pgpoll.materialize.run.Materializer`
that depend on the state's format; the Delta and Iceberg materializers
(:mod:`pgpoll.materialize.delta.state`, :mod:`pgpoll.materialize.iceberg.state`)
override them.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pgpoll.errors import ConfigError
from pgpoll.lsn import Lsn
from pgpoll.materialize.delta.table import footer_files
from pgpoll.materialize.driver.run import parquet_files, read_parquet_files, small_files, write_state_file
from pgpoll.materialize.run_types import MaterializeOptions
from pgpoll.materialize.state import StateColumn
from pgpoll.materialize.state_log import STATE_FILE, StateLog, StateRecord, scratch_name
from pgpoll.sink.stores.filesystem import local_path
from pgpoll.sink.stores.output_fs import OutputFs

log = logging.getLogger("pgpoll.materialize")


class ParquetState:
    """How a materialize run keeps each table's state as a Parquet directory (mixed into ``Materializer``).

    The run provides the attributes below; ``spark`` and ``read_parquet`` are
    the run's too (named here for the type checker only).
    """

    opts: MaterializeOptions
    dest: OutputFs
    engine: str
    pins: dict[str, int]
    """The state record each table's run builds on (:mod:`pgpoll.materialize.state_log`)."""

    if TYPE_CHECKING:
        @property
        def spark(self) -> Any: ...

        def read_parquet(self, fs: Any, paths: Sequence[str], files: bool = False) -> Any: ...

    publishes_by_rename = True
    """The Parquet state is swapped in with directory renames, which an object store does not have."""

    def _read_marker(self, name: str) -> dict[str, Any] | None:
        path = self.dest.path(name, STATE_FILE)
        if self.dest.exists(self.dest.path(name, "_delta_log")):
            raise ConfigError(f"{self.dest.path(name)} is a Delta table (written with --format delta)",
                              "materialize with --format delta, or into another --to DEST")
        self.pins[name] = StateLog(self.dest, name).pin()  # finishes a crashed run's publish first
        if self.opts.full or not self.dest.exists(path):
            return None
        try:
            marker = json.loads(self.dest.read_text(path))
            Lsn.parse(marker["position"])
            return marker if isinstance(marker, dict) else None
        except (ValueError, KeyError, TypeError):
            log.warning("state of %s is unreadable; rebuilding it", name)
            return None

    def _read_previous(self, name: str, events: Any = None, key: Sequence[str] = (),
                       columns: Sequence[StateColumn] = ()) -> Any:
        """The previous state of one table as a Spark frame (``events``, ``key``, ``columns``: what this run
        applies, for a subclass that reads only the part of the state they touch)."""
        return self.read_parquet(self.dest, [self.dest.path(name)])

    def _write(self, name: str, frame: Any, marker: dict[str, Any], key: list[str]) -> int:
        """Write and publish the new state of one table (``key``: its identity columns); returns its rows.

        Fenced (:mod:`pgpoll.materialize.state_log`): record pinned+1 is
        created exclusively before the directory is swapped; a run that loses
        removes its directory and raises SinkError.
        """

        def files(scratch: str) -> int:
            frame.write.parquet(scratch)
            local = local_path(scratch)  # a local state counts its rows from the footers, not with a Spark job
            return (sum(f.records for f in footer_files(local, "", ())) if local is not None
                    else int(self.spark.read.parquet(scratch).count()))

        return self._publish(name, marker, files)

    def _write_arrow(self, name: str, table: Any, marker: dict[str, Any], key: list[str]) -> int:
        """:meth:`_write` for a state computed in the driver (a local DEST): one Parquet file written by pyarrow."""
        return self._publish(name, marker, lambda scratch: write_state_file(table, scratch))

    def _publish(self, name: str, marker: dict[str, Any], files: Callable[[str], int]) -> int:
        """Write the state's files into a scratch directory with ``files`` (returns the rows), then publish it."""
        states = StateLog(self.dest, name)
        run = uuid.uuid4().hex[:8]
        seq = self.pins.get(name, 0) + 1
        scratch_dir = scratch_name(name, seq, run)
        scratch = self.dest.path(scratch_dir)
        try:
            rows = files(scratch)
        except Exception:
            self.dest.delete(scratch)
            states.check_pin(seq - 1)  # another run's swap removed what this one read: report that
            raise
        state = {**marker, "rows": rows, "seq": seq, "run": run}
        self.dest.write_text(f"{scratch}/{STATE_FILE}", json.dumps(state, sort_keys=True))
        states.commit(StateRecord(seq, name, scratch_dir, run, state))
        self.pins[name] = seq
        return rows

    def driver_previous(self, name: str, events: Any, key: list[str], columns: list[StateColumn],
                        schema: Any) -> tuple[Any, str | None]:
        """The previous state of one table as an Arrow table read in the driver (a local DEST), or why it is
        left to Spark (too large to hold in the driver)."""
        files = parquet_files(local_path(self.dest.path(name)) or "")
        if self.engine != "driver" and not small_files(files):
            return None, "the previous state is large"
        return read_parquet_files(files), None
