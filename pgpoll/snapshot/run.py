"""One snapshot run, coordinated on the driver: preflight, leases, plan or resume, chunk jobs, convergence.

The driver never handles rows. It checks the slot (it must exist and not be
lost; the snapshot never touches it), lists the captured tables, takes a
lease per table (a second snapshot of a table exits 3 at once, before
anything is written), then either resumes the incomplete snapshot planned
with the same arguments or plans a new one (``plan.json`` before any chunk
is read). The chunks still missing run as Spark tasks
(:mod:`pgpoll.snapshot.chunk_task`): every chunked table's in ONE job whose
partitions each take their chunks one after the other, so at most
``parallelism`` connections read at once; then, in a second job, the recheck
pieces of the chunked tables that need one (:mod:`pgpoll.snapshot.recheck`:
after the last chunk of their table); each shared-snapshot table in its own
job, under one exported snapshot held open by the driver. Finally the
driver waits until every transaction listed as in progress in any chunk's
snapshot has finished, and records that LSN (the convergence LSN) in
``complete.json``. An interrupted run (SIGINT/SIGTERM) keeps its finished
chunks: the next run with the same arguments reads only the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgpoll import stopping
from pgpoll.errors import ConfigError, PgpollError, SinkError, TableRewrittenError
from pgpoll.observe.lineage import observed
from pgpoll.observe.runs import run_ended, run_started
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.snapshot_store import SnapshotStore, find_resumable, new_snapshot_id, now_iso, table_lease
from pgpoll.sink.stores.filesystem import OutputFs, check_writable, needs_spark, open_output
from pgpoll.snapshot import planning, recheck
from pgpoll.snapshot.chunk_task import PAUSE_ENV, ChunkWork
from pgpoll.snapshot.engines import Runner, choose_runner, run_in_driver
from pgpoll.snapshot.progress import Watcher
from pgpoll.stopping import StopRequest

if TYPE_CHECKING:
    from pgpoll.source.control import ControlConnection
    from pgpoll.source.snapshot.catalog import SnapshotTable

log = logging.getLogger("pgpoll.snapshot")

MAX_DEFAULT_PARALLELISM = 8
SHARED_ATTEMPTS = 3  # reads of a shared-snapshot table rewritten under it, before the run stops (exit 4)


@dataclass(frozen=True)
class SnapshotOptions:
    """The options of ``pgpoll snapshot`` and ``jobs/snapshot.py`` (same names)."""

    slot: str
    output: str
    publications: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    exclude_tables: tuple[str, ...] = ()
    row_filters: tuple[str, ...] = ()
    chunk_rows: int = 100_000
    chunk_seconds: float | None = 2.0
    mode: str = "auto"
    parallelism: int | None = None
    lock_timeout_s: float = 5.0
    wait_timeout_s: float = 600.0
    shared_snapshot_timeout_s: float = 3600.0
    dsn: str | None = None
    pushgateway: str | None = None  # None: PGPOLL_PUSHGATEWAY (pgpoll.observe.runs)


@dataclass
class SnapshotSummary:
    """The JSON line a run prints on stdout."""

    slot: str
    snapshot_id: str | None = None
    plugin: str | None = None
    tables: int = 0
    chunks: int = 0
    chunks_read: int = 0
    rows: int = 0
    bytes: int = 0
    resumed: bool = False
    convergence_lsn: str | None = None
    seconds: float = 0.0
    status: str = "ok"
    exit_code: int = 0
    table_names: list[str] = field(default_factory=list)
    #: per table: ``{"mode", "why", "recheck", "chunks"}`` (how it was read and why)
    table_modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the longest any chunk (or recheck piece) held its snapshot, in seconds
    longest_snapshot_s: float = 0.0
    #: recheck pieces read by this run, and the rows they read (pgpoll.snapshot.recheck)
    rechecks_read: int = 0
    recheck_rows: int = 0
    #: where the chunks ran: "driver" (threads of this process) or "spark" (pgpoll.snapshot.engines); None: none ran
    engine: str | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.__dict__, sort_keys=True)


def _check_output(output: str) -> None:
    if needs_spark(output):
        raise ConfigError(
            f"pgpoll snapshot writes local paths, file: URIs and object stores (s3://, gs://, az://), not {output!r}",
            "snapshot to a local path or an object store (the tasks write Parquet with pyarrow)",
        )
    from pgpoll.spark.filesystems import check_local_output

    check_local_output(output)


def _prepare(opts: SnapshotOptions) -> None:
    from pgpoll.source.arrow_peek import requested_fetch
    from pgpoll.source.names import check_slot_name

    check_slot_name(opts.slot)
    requested_fetch()  # PGPOLL_FETCH: a bad value is exit 2 at once
    if opts.row_filters:
        from pgpoll.rowfilter.expression import parse_row_filter

        for text in opts.row_filters:
            parse_row_filter(text)
    _check_output(opts.output)


def _preflight(control: ControlConnection, opts: SnapshotOptions) -> tuple[str, list[SnapshotTable]]:
    """The slot's plugin and the tables to read."""
    from pgpoll.source.snapshot.catalog import snapshot_tables
    from pgpoll.source.snapshot.reads import check_source
    from pgpoll.table_patterns import TablePatterns

    source = control.call(lambda c: check_source(c, opts.slot))
    plugin = str(source.plugin)
    if plugin == "pgoutput" and not opts.publications:
        raise ConfigError(f'slot "{opts.slot}" uses pgoutput, which needs a publication', "pass --publication NAME")
    if opts.row_filters:
        from pgpoll.source.row_filter_check import checked_client_row_filters

        control.call(lambda c: checked_client_row_filters(c, plugin, opts.row_filters))
    patterns = TablePatterns(tuple(opts.tables), tuple(opts.exclude_tables))
    tables = list(control.call(lambda c: snapshot_tables(
        c, plugin=plugin, publications=list(opts.publications), patterns=patterns, mode=opts.mode)))
    if not tables:
        raise ConfigError("no table to snapshot", "check --publication, --tables and --exclude-tables")
    for t in tables:
        if t.warning:
            log.warning("%s: %s", t.qualified_name, t.warning)
    return plugin, tables


def _take_leases(fs: OutputFs, tables: Sequence[SnapshotTable], run_id: str, slot: str) -> list[Lease]:
    leases: list[Lease] = []
    try:
        for t in sorted(tables, key=lambda t: (t.schema, t.table)):
            lease = table_lease(fs, t.schema, t.table, run=run_id, slot=slot)
            lease.acquire()
            leases.append(lease)
    except BaseException:
        _release(leases)
        raise
    return leases


def _release(leases: Sequence[Lease]) -> None:
    for lease in leases:
        try:
            lease.release()
        except PgpollError as exc:  # it expires by itself
            log.warning("could not release a snapshot lease: %s", exc.message)


def _plan_or_resume(control: ControlConnection, fs: OutputFs, opts: SnapshotOptions, plugin: str,
                    tables: Sequence[SnapshotTable],
                    summary: SnapshotSummary) -> tuple[SnapshotStore, dict[str, Any]]:
    from pgpoll.source.server_identity import read_identity
    from pgpoll.source.snapshot.reads import current_wal_lsn, plan_chunks

    server = control.call(read_identity).as_json()
    args = planning.normalised_args(
        slot=opts.slot, plugin=plugin, publications=opts.publications, tables=opts.tables,
        exclude_tables=opts.exclude_tables, row_filters=opts.row_filters, chunk_rows=opts.chunk_rows, mode=opts.mode,
        chunk_seconds=opts.chunk_seconds)
    sid = find_resumable(fs, args)
    if sid is not None:
        store = SnapshotStore(fs, sid)
        plan = store.plan()
        if planning.same_tables(plan, tables) and planning.same_server(plan, server):
            summary.resumed = True
            for entry in plan["tables"]:
                store.resume_table(entry["dir"])  # (a partly read shared-snapshot table is read again as a whole)
            log.info("resuming snapshot %s", sid)
            return store, plan
        log.info("snapshot %s was planned for other tables or table shapes, or on another server or timeline: "
                 "starting a new one", sid)
    sid = new_snapshot_id()
    plan_lsn = int(control.call(current_wal_lsn))
    entries = []
    for t in tables:
        chunks = control.call(functools.partial(plan_chunks, t=t, chunk_rows=opts.chunk_rows,
                                                chunk_seconds=opts.chunk_seconds))
        pieces = []
        if t.recheck:  # block ranges per leaf, as a shared read's, PIECE_SCALE times a chunk's rows and time
            scale = recheck.PIECE_SCALE
            pieces = recheck.numbered(control.call(functools.partial(
                plan_chunks, t=dataclasses.replace(t, mode="shared"), chunk_rows=opts.chunk_rows * scale,
                chunk_seconds=None if opts.chunk_seconds is None else opts.chunk_seconds * scale)))
        entries.append(planning.table_entry(t, chunks, pieces))
    plan = planning.build_plan(sid, slot=opts.slot, plugin=plugin, publications=opts.publications, args=args,
                               plan_lsn=plan_lsn, entries=entries, server=server)
    store = SnapshotStore(fs, sid)
    store.create_plan(plan)
    return store, plan


def _work(store: SnapshotStore, t: SnapshotTable, opts: SnapshotOptions, dsn: str, entry: dict[str, Any],
          spec: dict[str, Any], **more: Any) -> ChunkWork:
    from pgpoll.source.arrow_peek import requested_fetch

    return ChunkWork(dsn=dsn, output=opts.output, fs=store.fs, snapshot_id=store.snapshot_id, table=t,
                     chunk=planning.chunk_from_json(spec), lock_timeout_ms=int(opts.lock_timeout_s * 1000),
                     row_filters=opts.row_filters, plan_relfilenode=entry.get("relfilenode"),
                     pause_dir=os.environ.get(PAUSE_ENV) or None, fetch=requested_fetch(), **more)


def _missing_works(store: SnapshotStore, plan: dict[str, Any], by_name: dict[tuple[str, str], SnapshotTable],
                   opts: SnapshotOptions, dsn: str, entry: dict[str, Any], exported: str | None = None,
                   exported_relfilenode: int | None = None) -> list[ChunkWork]:
    done = store.manifests(entry["dir"])
    t = by_name[(entry["schema"], entry["table"])]
    return [_work(store, t, opts, dsn, entry, c, exported=exported, exported_relfilenode=exported_relfilenode)
            for c in entry["chunks"] if int(c["n"]) not in done]


def _recheck_works(store: SnapshotStore, by_name: dict[tuple[str, str], SnapshotTable], opts: SnapshotOptions,
                   dsn: str, entry: dict[str, Any]) -> list[ChunkWork]:
    """The table's missing recheck pieces, once its every key chunk is in (see :mod:`pgpoll.snapshot.recheck`)."""
    specs = recheck.recheck_specs(entry)
    done = store.manifests(entry["dir"]) if specs else {}
    if not specs or any(int(c["n"]) not in done for c in entry["chunks"]) or not recheck.needed(done):
        return []
    t = by_name[(entry["schema"], entry["table"])]
    since = recheck.since(done)
    return [_work(store, t, opts, dsn, entry, c, recheck_since=since) for c in specs if int(c["n"]) not in done]


def _read_chunks(run: Runner, default: int, store: SnapshotStore, plan: dict[str, Any], tables: Sequence[SnapshotTable],
                 opts: SnapshotOptions, dsn: str, stop: StopRequest | None, summary: SnapshotSummary) -> int:
    """Run every missing chunk with ``run`` (Spark jobs or the driver's threads; ``default`` parallelism), then the
    chunked tables' recheck pieces; returns how many chunks this run read (``summary.longest_snapshot_s`` learns how
    long each shared snapshot was held)."""
    from pgpoll.source.snapshot.reads import SharedSnapshot

    parallelism = opts.parallelism or max(1, min(default, MAX_DEFAULT_PARALLELISM))
    by_name = {(t.schema, t.table): t for t in tables}
    chunked_entries = [e for e in plan["tables"] if e["mode"] == "chunked"]
    for entry in chunked_entries:  # a recheck must follow the table's last chunk read
        done = store.manifests(entry["dir"])
        if any(int(c["n"]) not in done for c in entry["chunks"]) and recheck.forget(store, entry["dir"], done):
            log.info("%s: chunks to read again; its recheck follows them", entry["dir"])
    chunked = [w for e in chunked_entries for w in _missing_works(store, plan, by_name, opts, dsn, e)]
    read = len(run(chunked, parallelism, stop))
    if stop is None or not stop.requested:
        pieces = [w for e in chunked_entries for w in _recheck_works(store, by_name, opts, dsn, e)]
        summary.rechecks_read = len(run(pieces, parallelism, stop))
    for entry in plan["tables"]:
        if entry["mode"] != "shared" or (stop is not None and stop.requested):
            continue
        if len(store.manifests(entry["dir"])) == len(entry["chunks"]):
            continue
        t = by_name[(entry["schema"], entry["table"])]
        for attempt in range(1, SHARED_ATTEMPTS + 1):
            store.reset_table(entry["dir"])  # all of it under one snapshot
            try:
                with SharedSnapshot(dsn, t, opts.shared_snapshot_timeout_s,
                                    lock_timeout_ms=int(opts.lock_timeout_s * 1000)) as shared:
                    held = time.monotonic()
                    works = _missing_works(store, plan, by_name, opts, dsn, entry, exported=shared.exported,
                                           exported_relfilenode=shared.relfilenode)
                    read += len(run(works, parallelism, stop))
                    held = time.monotonic() - held
                summary.longest_snapshot_s = max(summary.longest_snapshot_s, round(held, 3))
                break
            except TableRewrittenError as exc:
                if attempt == SHARED_ATTEMPTS:
                    raise
                log.warning("%s; reading it again under a new snapshot (attempt %d of %d)",
                            exc.message, attempt + 1, SHARED_ATTEMPTS)
    return read


def _bytes_so_far(store: SnapshotStore, plan: dict[str, Any]) -> int:
    return sum(int(m.get("bytes", 0)) for e in plan["tables"] for m in store.manifests(e["dir"]).values())


def _complete(control: ControlConnection, store: SnapshotStore, plan: dict[str, Any], opts: SnapshotOptions,
              summary: SnapshotSummary) -> None:
    from pgpoll.lsn import Lsn
    from pgpoll.source.snapshot.reads import wait_for_transactions

    xips: set[int] = set()
    rows = chunks = size = recheck_rows = 0
    held = 0.0
    for entry in plan["tables"]:
        done = store.manifests(entry["dir"])
        missing = [c["n"] for c in entry["chunks"] if int(c["n"]) not in done]
        if not missing and recheck.needed(done):
            missing = [c["n"] for c in recheck.recheck_specs(entry) if int(c["n"]) not in done]
        if missing:
            raise SinkError(f"snapshot {store.snapshot_id}: chunks {missing[:5]} of {entry['schema']}.{entry['table']} "
                            "are missing", "rerun the same snapshot command to read them")
        for n, manifest in done.items():
            xips.update(int(x) for x in manifest.get("snapshot", {}).get("xip", ()))
            held = max(held, float(manifest.get("held_s", 0.0)))
            size += int(manifest.get("bytes", 0))
            if n >= recheck.RECHECK_FIRST:
                recheck_rows += int(manifest.get("rows", 0))
                continue
            rows += int(manifest.get("rows", 0))
            chunks += 1
    summary.rows, summary.bytes, summary.chunks, summary.recheck_rows = rows, size, chunks, recheck_rows
    summary.longest_snapshot_s = max(summary.longest_snapshot_s, round(held, 3))
    lsn = int(control.call(lambda c: wait_for_transactions(c, sorted(xips), opts.wait_timeout_s)))
    done_doc = store.write_complete({
        "snapshot_id": store.snapshot_id, "completed_at": now_iso(), "convergence_lsn": str(Lsn(lsn)),
        "convergence_lsn_int": lsn, "rows": rows, "chunks": chunks,
        "tables": [f"{e['schema']}.{e['table']}" for e in plan["tables"]],
    })
    summary.convergence_lsn = str(done_doc["convergence_lsn"])


def _modes(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``snapshot --json``'s ``table_modes``: how each table is read, and why."""
    return {f"{e['schema']}.{e['table']}": {"mode": e["mode"], "why": e.get("mode_reason", ""),
                                           "chunks": len(e["chunks"]), "recheck": bool(e.get("rechecks"))}
            for e in plan["tables"]}


@observed("snapshot")  # OpenLineage START, then COMPLETE/FAIL/ABORT (when configured)
def run_snapshot(opts: SnapshotOptions, spark: Any = None, stop: StopRequest | None = None,
                 show_progress: Callable[[str], None] | None = None) -> SnapshotSummary:
    """:func:`take_snapshot`, recorded in the output's run history and pushed to a Pushgateway (failed runs too)."""
    run = run_started("snapshot", output=opts.output, slot=opts.slot, pushgateway=opts.pushgateway)
    try:
        summary = take_snapshot(opts, spark, stop, show_progress)
    except BaseException as error:
        run_ended(run, error=error, stopped=stop.exit_code if stop is not None and stop.requested else None)
        raise
    run_ended(run, status=summary.status, exit_code=summary.exit_code, batches=summary.chunks_read,
              changes=summary.rows, bytes_=summary.bytes)
    return summary


def take_snapshot(opts: SnapshotOptions, spark: Any = None, stop: StopRequest | None = None,
                  show_progress: Callable[[str], None] | None = None) -> SnapshotSummary:
    """Snapshot the captured tables into the output; returns the summary (status "interrupted" on a stop)."""
    from pgpoll.source.connection import resolve_dsn
    from pgpoll.source.control import ControlConnection

    started = time.monotonic()
    _prepare(opts)
    summary = SnapshotSummary(slot=opts.slot)
    target = resolve_dsn(opts.dsn)
    control = ControlConnection(target, opts.slot)
    control.open()
    leases: list[Lease] = []
    watcher: Watcher | None = None
    try:
        plugin, tables = _preflight(control, opts)
        summary.plugin, summary.tables = plugin, len(tables)
        summary.table_names = sorted(f"{t.schema}.{t.table}" for t in tables)
        fs = open_output(opts.output)
        check_writable(fs)  # a wrong secret, a missing bucket, a stopped store: exit 5 in seconds, nothing written
        leases = _take_leases(fs, tables, uuid.uuid4().hex, opts.slot)  # busy: exit 3 before anything is written
        store, plan = _plan_or_resume(control, fs, opts, plugin, tables, summary)
        summary.snapshot_id = store.snapshot_id
        summary.chunks = sum(len(e["chunks"]) for e in plan["tables"])
        summary.table_modes = _modes(plan)
        for name, how in summary.table_modes.items():
            log.info("%s: %s (%s)", name, how["mode"], how["why"])
        watcher = Watcher(store, [e["dir"] for e in plan["tables"]], summary.chunks, leases, show_progress,
                          pieces=sum(len(recheck.recheck_specs(e)) for e in plan["tables"]))
        watcher.start()
        if stop is None or not stop.requested:
            run, default = choose_runner(spark, opts.output, stop)
            summary.engine = "spark" if run is not run_in_driver else "driver"
            with contextlib.suppress(stopping.StopRequestedError):  # stopped: reported below
                summary.chunks_read = _read_chunks(run, default, store, plan, tables, opts, target.dsn, stop, summary)
        if watcher.lost is not None:
            raise watcher.lost
        if stop is not None and stop.requested:
            summary.status, summary.exit_code = "interrupted", stop.exit_code
            watcher.tick()
            summary.rows = watcher.rows()
            summary.chunks_read = watcher.chunks_done() - watcher.chunks_before
            summary.bytes = _bytes_so_far(store, plan)
        else:
            _complete(control, store, plan, opts, summary)
    finally:
        if watcher is not None:
            watcher.stop()
        _release(leases)
        control.close()
        summary.seconds = round(time.monotonic() - started, 3)
    return summary
