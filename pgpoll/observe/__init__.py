"""What operators see of pgpoll's runs: the run history, Prometheus metrics, OpenLineage events, the report.

It may import the layers below the jobs (``sink/``, ``source/``, the pure layers), ``errors`` and the CLI's
exit-code mapping (``cli/exitcodes.py``, no click: the one place errors become codes), but no job's package:
the jobs call in here, once at a run's start and once at its end, never the other way round.
"""
