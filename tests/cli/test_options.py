"""Shared option types: sizes in bytes as PostgreSQL writes them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.cli.options import ByteSize


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("1048576", 1 << 20), ("4kB", 4 << 10), ("256MB", 256 << 20), ("256 MiB", 256 << 20), ("1GB", 1 << 30),
     ("2gib", 2 << 30), ("1TB", 1 << 40), (512, 512)],
)
def test_sizes_read_as_postgresql_reads_memory_settings(text: str | int, size: int) -> None:
    assert ByteSize().convert(text, None, None) == size


@pytest.mark.parametrize("text", ["", "1.5GB", "-1", "12QB", "GB", "1 G B x"])
def test_anything_else_is_a_usage_error_before_connecting(text: str) -> None:
    result = CliRunner().invoke(cli, ["ingest", "--slot", "s", "--output", "out-never-written", "--batch-wal", text],
                                env={"PGPOLL_DSN": "host=/nonexistent"})
    assert result.exit_code == 2 and "is not a size" in result.output
