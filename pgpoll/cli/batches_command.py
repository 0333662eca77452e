"""``pgpoll batches``: what an output's commit log holds, batch by batch, without Spark or a server."""

from __future__ import annotations

from typing import Any

import click

from pgpoll.cli.output import echo_json, echo_table
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


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums and bounds over the listed batches."""
    known_bytes = [r["bytes"] for r in rows if r["bytes"] is not None]
    newest = [r["last_commit_ts"] for r in rows if r["last_commit_ts"]]
    return {
        "batches": len(rows),
        "gaps": sum(1 for r in rows if r["kind"] == "gap"),
        "rows": sum(r["rows"] for r in rows),
        "files": sum(r["files"] for r in rows),
        "bytes": sum(known_bytes) if known_bytes or not rows else None,
        "first_lsn": rows[0]["start"] if rows else None,
        "last_lsn": rows[-1]["end"] if rows else None,
        "first_committed_at": rows[0]["committed_at"] if rows else None,
        "last_committed_at": rows[-1]["committed_at"] if rows else None,
        "newest_change": max(newest) if newest else None,
    }


def _short_time(text: str | None) -> str:
    return text.replace("T", " ")[:19] if text else ""


@click.command("batches")
@click.option("--output", required=True, help="The output path pgpoll ingest writes (a local path, file: URI or "
              "object store: s3://, gs://, az://).")
@click.option("--last", type=click.IntRange(min=1), default=None, help="Only the newest N batches (totals over those).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per batch, then {\"totals\": ...}.")
def command(output: str, last: int | None, as_json: bool) -> None:
    """List the committed batches of OUTPUT (LSN range, rows, files, bytes, times), newest last, then totals.

    Reads only the commit log (no Spark, no database connection).
    """
    fs = open_output(output)
    check_readable(fs)  # an unreachable store, a wrong secret: exit 5 in seconds
    rows = [batch_row(r) for r in CommitLog(fs).records()]
    if last is not None:
        rows = rows[-last:]
    summary = totals(rows)
    if as_json:
        for row in rows:
            echo_json(row)
        echo_json({"totals": summary})
        return
    echo_table(
        ["seq", "lsn_range", "rows", "files", "bytes", "committed_at", "newest_change"],
        [
            [r["seq"], f'{r["start"]}-{r["end"]}' if r["kind"] != "gap" else f'GAP: {r["start"]}-{r["resume"]} missing',
             r["rows"], r["files"], "" if r["bytes"] is None else r["bytes"],
             _short_time(r["committed_at"]), _short_time(r["last_commit_ts"])]
            for r in rows
        ],
    )
    click.echo(
        f'total: {summary["batches"]} batch(es), {summary["rows"]:,} row(s), {summary["files"]} file(s)'
        + (f', {summary["bytes"]:,} bytes' if summary["bytes"] is not None else "")
        + (f', {summary["first_lsn"]}..{summary["last_lsn"]}' if rows else "")
        + (f', {summary["gaps"]} gap(s): see docs/how-to/lost-slot.md' if summary["gaps"] else "")
    )
