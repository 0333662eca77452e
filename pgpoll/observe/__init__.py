"""What operators see of pgpoll's runs: the run history, Prometheus metrics (and OpenLineage events).

Imports the sink's stores and layout, ``errors`` and the CLI's exit-code mapping (the one place errors become
codes); never a job's package: the jobs call in here, once at a run's start and once at its end.
"""
