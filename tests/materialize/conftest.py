"""Helpers for the materialize tests: run ``pgpoll materialize`` in-process and read a table's state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.sink.layout import table_dir_name


def materialize(output: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """``pgpoll materialize --output OUTPUT --json ARGS``: exit code, one dict per table, stderr."""
    result = CliRunner().invoke(cli, ["materialize", "--output", output, "--json", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, [t for t in lines if "table" in t], result.stderr  # the last line is the run's summary


def state_rows(spark: Any, output: str, schema: str, table: str, dest: str | None = None) -> list[dict[str, Any]]:
    """The materialized rows of one table (user columns only), as dicts."""
    path = Path(dest or Path(output) / "state") / table_dir_name(schema, table)
    frame = spark.read.parquet(str(path))
    names = [c for c in frame.columns if not c.startswith("_")]
    return [row.asDict(recursive=True) for row in frame.select(*[f"`{n}`" for n in names]).collect()]
