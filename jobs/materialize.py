"""spark-submit entry point: ``spark-submit jobs/materialize.py --output PATH [--to DEST] ...``.

Runs exactly ``pgpoll materialize`` with the same options and exit codes.
"""

from __future__ import annotations

import sys

from pgpoll.cli.main import main

if __name__ == "__main__":
    main(["materialize", *sys.argv[1:]])
