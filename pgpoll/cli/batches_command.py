"""``pgpoll batches``: what an output's commit log holds, batch by batch, without Spark or a server.

The newest batches by default, read by name from the commit log's state: a bounded read however long the
history (a 5-minute schedule commits about 105,000 batches a year); ``--all`` streams every one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import click

from pgpoll.cli.output import echo_json
from pgpoll.sink.commit.log import CommitLog, CommitRecord
from pgpoll.sink.stores.filesystem import check_readable, open_output


def batch_row(record: CommitRecord) -> dict[str, Any]:
    """One committed batch as ``--json`` prints it (``bytes`` is null for version-1 records, which lack it)."""
    return {
        "seq": record.seq,
        "version": record.version,
        "start": record.start,
        "end": record.end,
        "rows": record.rows,
        "files": len(record.files),
        "bytes": record.bytes if record.version >= 2 else None,
        "partition": record.partition,
        "tables": list(record.tables),
        "committed_at": record.committed_at,
        "first_commit_ts": record.first_commit_ts,
        "last_commit_ts": record.last_commit_ts,
        "slot": record.slot,
        "plugin": record.plugin,
        "kind": record.kind,  # "gap": the changes in (start, resume] are missing (pgpoll resync marked them)
        "resume": record.resume,
    }


def totals(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sums and bounds over the listed batches (one pass: ``--all`` streams them)."""
    count = rows_sum = files = gaps = 0
    known_bytes: int | None = None
    first: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    newest: str | None = None
    for r in rows:
        first = first or r
        last = r
        count, rows_sum, files = count + 1, rows_sum + r["rows"], files + r["files"]
        gaps += r["kind"] == "gap"
        if r["bytes"] is not None:
            known_bytes = (known_bytes or 0) + r["bytes"]
        if r["last_commit_ts"] and (newest is None or r["last_commit_ts"] > newest):
            newest = r["last_commit_ts"]
    return {
        "batches": count,
        "gaps": gaps,
        "rows": rows_sum,
        "files": files,
        "bytes": known_bytes if known_bytes is not None or not count else None,
        "first_lsn": first["start"] if first else None,
        "last_lsn": last["end"] if last else None,
        "first_committed_at": first["committed_at"] if first else None,
        "last_committed_at": last["committed_at"] if last else None,
        "newest_change": newest,
    }


def _short_time(text: str | None) -> str:
    return text.replace("T", " ")[:19] if text else ""


DEFAULT_LAST = 20
"""Batches ``pgpoll batches`` lists without ``--last`` or ``--all``: the newest, read by name (a bounded read)."""
_HEADERS = ["seq", "lsn_range", "rows", "files", "bytes", "committed_at", "newest_change"]


def _cells(r: dict[str, Any]) -> list[Any]:
    lsn_range = f'{r["start"]}-{r["end"]}' if r["kind"] != "gap" else f'GAP: {r["start"]}-{r["resume"]} missing'
    return [r["seq"], lsn_range, r["rows"], r["files"], "" if r["bytes"] is None else r["bytes"],
            _short_time(r["committed_at"]), _short_time(r["last_commit_ts"])]


def _table(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Print ``rows`` as a table as they are read (widths from the first thousand), passing each on."""
    head = list(itertools.islice(rows, 1000))
    widths = [max([len(h)] + [len(str(_cells(r)[i])) for r in head]) for i, h in enumerate(_HEADERS)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(_HEADERS, widths, strict=True)).rstrip())
    for r in itertools.chain(head, rows):
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(_cells(r), widths, strict=True)).rstrip())
        yield r


def _json(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Print each row as one JSON object as it is read, passing it on."""
    for r in rows:
        echo_json(r)
        yield r


@click.command("batches")
@click.option("--output", required=True, help="The output path pgpoll ingest writes (a local path, file: URI or "
              "object store: s3://, gs://, az://).")
@click.option("--last", type=click.IntRange(min=1), default=None,
              help=f"Only the newest N batches (default {DEFAULT_LAST}; totals over those).")
@click.option("--all", "every", is_flag=True, help="Every batch of the whole history, printed as it is read (one "
              "read per batch: long on an object store after months of runs).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per batch, then {\"totals\": ...}.")
def command(output: str, last: int | None, every: bool, as_json: bool) -> None:
    """List the newest committed batches of OUTPUT (LSN range, rows, files, bytes, times), newest last, then totals.

    Reads only the commit log (no Spark, no database connection): its state and the newest batches by name,
    however long the history; --all reads every batch.
    """
    if every and last is not None:
        raise click.UsageError("--all and --last exclude each other: --all lists every batch, --last N the newest N")
    fs = open_output(output)
    check_readable(fs)  # an unreachable store, a wrong secret: exit 5 in seconds
    commit_log = CommitLog(fs)
    if every:
        records: Iterable[CommitRecord] = commit_log.iter_records()
        head = None
    else:
        state = commit_log.state()
        head = state.head
        shown = max(state.head - (last or DEFAULT_LAST), 0)
        records = commit_log.records_after(shown, state)
        if 0 < (gap := state.newest_gap()) <= shown:  # a gap older than the rows shown: say so all the same
            click.echo(f"note: record {gap} is a gap (changes missing from the output); see it with --all, and "
                       "docs/how-to/lost-slot.md", err=True)
    rows = (batch_row(r) for r in records)
    if as_json:
        echo_json({"totals": totals(_json(rows))})  # totals in the same pass: nothing kept
        return
    summary = totals(_table(rows))
    click.echo(
        f'total: {summary["batches"]} batch(es), {summary["rows"]:,} row(s), {summary["files"]} file(s)'
        + (f', {summary["bytes"]:,} bytes' if summary["bytes"] is not None else "")
        + (f', {summary["first_lsn"]}..{summary["last_lsn"]}' if summary["batches"] else "")
        + (f" (the newest {summary['batches']} of {head}; --all lists every one)"
           if head is not None and head > summary["batches"] else "")
        + (f', {summary["gaps"]} gap(s): see docs/how-to/lost-slot.md' if summary["gaps"] else "")
    )
