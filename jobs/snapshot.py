"""spark-submit entry point: ``spark-submit jobs/snapshot.py --slot NAME --output PATH [...]``.

Runs exactly ``pgpoll snapshot`` with the same options and exit codes.
"""

from __future__ import annotations

import sys

from pgpoll.cli.main import main

if __name__ == "__main__":
    main(["snapshot", *sys.argv[1:]])
