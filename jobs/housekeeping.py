"""spark-submit entry point: ``spark-submit jobs/housekeeping.py --output PATH [--retention AGE]``.

An output's daily housekeeping, as the Airflow DAG ``pgpoll_housekeeping`` runs
it: ``pgpoll compact --output PATH`` (merging small batch files; skipped by a
pgpoll that does not have the command yet), then ``pgpoll retain --output PATH
--json`` with ``--retention AGE`` when given (else ``PGPOLL_RETENTION``, else
off: nothing removed). The state tables' maintenance runs inside each
``materialize``. Each step prints its own lines; the last line is the job's
summary, ``{"status", "exit_code", "steps": {"compact": code or null, "retain": code}}``,
and its exit code is the first step's that failed (retention still runs after a
failed compaction: it needs nothing of it). The two never overlap: each holds the
other's lease, so run by hand beside this job one of them exits 3 and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys

from pgpoll.cli.main import cli, main


def _step(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def run(argv: list[str]) -> int:
    """Run the steps; returns the exit code."""
    parser = argparse.ArgumentParser(prog="housekeeping.py", description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="The output path pgpoll ingest writes.")
    parser.add_argument("--retention", default=None, help="pgpoll retain --retention (default: PGPOLL_RETENTION, else off).")
    args = parser.parse_args(argv)
    steps: dict[str, int | None] = {"compact": None, "retain": None}
    if "compact" in cli.commands:  # (pgpoll compact is newer than this job)
        steps["compact"] = _step(["compact", "--output", args.output])
    retention = ["--retention", args.retention] if args.retention else []
    steps["retain"] = _step(["retain", "--output", args.output, "--json", *retention])
    code = next((c for c in steps.values() if c), 0)
    print(json.dumps({"status": "ok" if code == 0 else "error", "exit_code": code, "job": "housekeeping",
                      "steps": steps}, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
