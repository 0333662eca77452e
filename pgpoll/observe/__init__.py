"""What operators see of pgpoll's runs: lineage events (OpenLineage), run history, metrics, the report.

It may import the layers below the jobs (``sink/``, ``source/``, the pure layers) but no job's package:
the jobs call into it at a run's start and end, never the other way round.
"""
