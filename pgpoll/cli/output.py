"""Formatting helpers for the CLI: aligned tables and JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import click


def echo_json(obj: Any) -> None:
    """Print one JSON object on one line."""
    click.echo(json.dumps(obj, ensure_ascii=False, default=str))


def echo_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print rows as an aligned plain-text table."""
    text_rows = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip())
    for row in text_rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())
