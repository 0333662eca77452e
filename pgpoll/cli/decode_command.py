"""``pgpoll decode``: decode captured plugin rows (``slot peek --json`` lines) into change envelopes."""

from __future__ import annotations

import json
from typing import Any, Optional, TextIO

import click

from pgpoll.cli.output import echo_json
from pgpoll.decode.assembler import TransactionAssembler
from pgpoll.decode.envelope import change_record_to_json
from pgpoll.errors import ConfigError, DecodeError
from pgpoll.lsn import Lsn


def _row_input(obj: Any, number: int) -> tuple[Any, Optional[Lsn], Optional[int]]:
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


@click.command("decode")
@click.option("--plugin", type=click.Choice(["test_decoding", "pgoutput"]), required=True, help="The plugin that produced the rows.")
@click.option("--proto-version", type=click.IntRange(1, 4), default=1, show_default=True, help="pgoutput protocol version of the capture.")
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
def command(plugin: str, proto_version: int, source: TextIO) -> None:
    """Decode the JSON lines of `pgpoll slot peek --json` from SOURCE (a file or -) into one JSON change per line.

    Exits 6 when any row could not be decoded (each bad row is named on stderr).
    """
    from pgpoll.ingest.task import make_decoder

    decode = make_decoder(plugin, proto_version)
    assembler = TransactionAssembler(allow_opaque_streams=True)
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
                raise ConfigError(f"row {number} holds text, but pgoutput rows are binary", "use the data_hex lines that slot peek --json prints for pgoutput")
            event = decode(data, lsn, xid)
            for record in assembler.feed(event):
                echo_json(change_record_to_json(record))
        except (DecodeError, ConfigError) as exc:
            bad += 1
            click.echo(f"row {number}: {exc.message}", err=True)
    assembler.finish()
    if bad:
        raise DecodeError(f"{bad} row(s) could not be decoded", "see the rows named above")

