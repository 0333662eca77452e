"""Benchmark: test_decoding line parsing speed, no server involved.

Builds N synthetic ``table public.data: INSERT: ...`` lines of five columns
(integer, text with a doubled quote, numeric, timestamptz, boolean), then
times:

1. decode: every line through ``TestDecodingDecoder.decode``;
2. decode + assemble: the same lines framed as transactions of 1,000 rows
   (BEGIN/COMMIT lines included) through the decoder and
   ``TransactionAssembler``.

Run standalone::

    python bench/bench_test_decoding.py [--lines N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgpoll.decode.assembler import TransactionAssembler
from pgpoll.decode.text_decoder import TestDecodingDecoder


def insert_line(i: int) -> str:
    """One INSERT line as test_decoding prints it."""
    return (
        f"table public.data: INSERT: id[integer]:{i} name[text]:'row {i} it''s' "
        f"amount[numeric]:{i}.25 created[timestamp with time zone]:'2026-11-22 01:53:54.095995+00' "
        "ok[boolean]:true"
    )


def main(argv: list[str] | None = None) -> int:
    """Print lines/s for decoding alone and for decoding plus assembling."""
    parser = argparse.ArgumentParser(description="test_decoding parse speed")
    parser.add_argument("--lines", type=int, default=1_000_000)
    n = parser.parse_args(argv).lines
    lines = [insert_line(i) for i in range(n)]

    decode = TestDecodingDecoder().decode
    start = time.perf_counter()
    for i, line in enumerate(lines):
        decode(line, i, 7)
    elapsed = time.perf_counter() - start
    print(f"decode:            {n:,} lines in {elapsed:.2f} s = {n / elapsed:,.0f} lines/s")

    decode = TestDecodingDecoder().decode
    feed = TransactionAssembler().feed
    records = 0
    start = time.perf_counter()
    for i, line in enumerate(lines):
        if i % 1000 == 0:
            feed(decode(f"BEGIN {i}", i, i))
        feed(decode(line, i, 7))
        if i % 1000 == 999 or i == n - 1:
            records += len(feed(decode(f"COMMIT {i}", i, i)))
    elapsed = time.perf_counter() - start
    print(f"decode + assemble: {n:,} lines in {elapsed:.2f} s = {n / elapsed:,.0f} lines/s ({records:,} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
