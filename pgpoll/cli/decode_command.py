"""``pgpoll decode``: decode captured plugin rows (``slot peek --json`` lines) into change envelopes.

Only committed changes are printed. A capture often ends inside a transaction
(``slot peek --limit`` stops after N rows, wherever that is), and dropping its
changes without a word looked like an empty slot; so the changes of every
transaction still open at the end of the input are counted on stderr, and
``--partial`` prints them too, marked ``"partial": true`` (no commit LSN: the
input does not say whether they commit).
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import click

from pgpoll.changes import (
    Begin,
    BeginPrepare,
    ChangeRecord,
    Commit,
    CommitPrepared,
    Event,
    LogicalMessage,
    Prepare,
    RollbackPrepared,
    RowChange,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from pgpoll.cli.output import echo_json
from pgpoll.decode.assembler import TransactionAssembler
from pgpoll.decode.change_json import Change, change_record_to_json, iter_records
from pgpoll.errors import ConfigError, DecodeError
from pgpoll.lsn import Lsn


def _row_input(obj: Any, number: int) -> tuple[Any, Lsn | None, int | None]:
    if not isinstance(obj, dict):
        raise DecodeError(f"row {number} is not a JSON object")
    lsn = Lsn.parse(obj["lsn"]) if obj.get("lsn") else None
    xid = obj.get("xid")
    if "data_hex" in obj:
        try:
            return bytes.fromhex(obj["data_hex"]), lsn, xid
        except (TypeError, ValueError):
            raise DecodeError(f"row {number}: data_hex is not hexadecimal") from None
    if "data" in obj:
        return obj["data"], lsn, xid
    raise DecodeError(f"row {number} has neither data nor data_hex")


class _Unfinished:
    """The changes of the transactions the assembler holds open: the plain one, streamed ones, prepared ones.

    Mirrors what :class:`TransactionAssembler` buffers, from the same events, so
    that the end of the input can report them; the assembler's own
    ``in_transaction``, ``open_streams`` and ``pending_prepared`` decide which
    of them are still open then.
    """

    def __init__(self) -> None:
        self.txn: list[Change] = []
        self.txn_xid: int | None = None
        self.streams: dict[int, list[Change]] = {}
        self.stream_xid: int | None = None
        self.prepared: dict[str, tuple[int | None, list[Change]]] = {}

    def track(self, event: Event) -> None:
        """Follow one event (fed to the assembler too)."""
        if isinstance(event, (Begin, BeginPrepare)):
            self.txn, self.txn_xid = [], event.xid
        elif isinstance(event, (RowChange, Truncate)) or (isinstance(event, LogicalMessage) and event.transactional):
            (self.streams.setdefault(self.stream_xid, []) if self.stream_xid is not None else self.txn).append(event)
        elif isinstance(event, Commit):
            self.txn = []
        elif isinstance(event, StreamStart):
            self.stream_xid = event.xid
        elif isinstance(event, StreamStop):
            self.stream_xid = None
        elif isinstance(event, StreamCommit):
            self.streams.pop(event.xid, None)
        elif isinstance(event, StreamAbort):
            if event.subxid == event.xid:
                self.streams.pop(event.xid, None)
            else:
                kept = [c for c in self.streams.get(event.xid, []) if c.xid != event.subxid]
                self.streams[event.xid] = kept
        elif isinstance(event, Prepare):
            changes = self.streams.pop(event.xid or 0, []) if event.streamed else self.txn
            self.prepared[event.gid or ""] = (event.xid, changes)
            self.txn = []
        elif isinstance(event, (CommitPrepared, RollbackPrepared)):
            self.prepared.pop(event.gid or "", None)

    def open_changes(self, assembler: TransactionAssembler) -> tuple[int, list[ChangeRecord]]:
        """(open transactions, their change records) at the end of the input; call before ``finish()``."""
        groups: list[tuple[int | None, list[Change]]] = []
        if assembler.in_transaction and self.stream_xid is None:
            groups.append((self.txn_xid, self.txn))
        groups += [(xid, self.streams.get(xid, [])) for xid in assembler.open_streams]
        groups += [self.prepared.get(gid, (None, [])) for gid in assembler.pending_prepared]
        records = [record for xid, changes in groups for record in iter_records(changes, None, xid, None)]
        return len(groups), records


@click.command("decode")
@click.option("--plugin", type=click.Choice(["test_decoding", "pgoutput"]), required=True,
              help="The plugin that produced the rows.")
@click.option("--proto-version", type=click.IntRange(1, 4), default=1, show_default=True,
              help="pgoutput protocol version of the capture.")
@click.option("--partial", is_flag=True, default=False,
              help='Also print the changes of transactions still open at the end of the input, with "partial": true.')
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
def command(plugin: str, proto_version: int, partial: bool, source: TextIO) -> None:
    """Decode the JSON lines of `pgpoll slot peek --json` from SOURCE (a file or -) into one JSON change per line.

    Only committed changes are printed; the changes of a transaction still open
    at the end of the input are counted on stderr (printed with --partial).
    Exits 6 when any row could not be decoded (each bad row is named on stderr).
    """
    from pgpoll.decode.decoders import make_decoder

    decode = make_decoder(plugin, proto_version)
    assembler = TransactionAssembler(allow_opaque_streams=True)
    unfinished = _Unfinished()
    bad = 0
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise DecodeError(f"row {number} is not JSON: {exc}") from None
            data, lsn, xid = _row_input(obj, number)
            if plugin == "test_decoding" and isinstance(data, str):
                data = data.encode("utf-8")
            if plugin == "pgoutput" and not isinstance(data, bytes):
                raise ConfigError(f"row {number} holds text, but pgoutput rows are binary",
                                  "use the data_hex lines that slot peek --json prints for pgoutput")
            event = decode(data, lsn, xid)
            records = assembler.feed(event)
            unfinished.track(event)
            for record in records:
                echo_json(change_record_to_json(record))
        except (DecodeError, ConfigError) as exc:
            bad += 1
            click.echo(f"row {number}: {exc.message}", err=True)
    _report_unfinished(*unfinished.open_changes(assembler), partial=partial)
    assembler.finish()
    if bad:
        raise DecodeError(f"{bad} row(s) could not be decoded", "see the rows named above")


def _report_unfinished(transactions: int, records: list[ChangeRecord], *, partial: bool) -> None:
    if not transactions:
        return
    where = f"the input ends inside {transactions} unfinished transaction(s)"
    if partial:
        for record in records:
            echo_json({**change_record_to_json(record), "partial": True})
        click.echo(f'{where}: printed their {len(records)} change(s) with "partial": true', err=True)
    else:
        click.echo(f"{where}: {len(records)} change(s) not printed (--partial prints them)", err=True)
