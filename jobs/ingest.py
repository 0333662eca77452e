"""spark-submit entry point: ``spark-submit jobs/ingest.py --slot S --output PATH ...``.

Runs exactly ``pgpoll ingest`` with the same options and exit codes.
"""

from __future__ import annotations

import sys

from pgpoll.cli.main import main

if __name__ == "__main__":
    main(["ingest", *sys.argv[1:]])
