"""Housekeeping of an output's history: ``pgpoll compact`` and ``pgpoll retain``.

A job package like :mod:`pgpoll.ingest`: it may import the shared layers
(:mod:`pgpoll.sink`, :mod:`pgpoll.source`, the pure modules) but no other job's
package. What it shares with ``materialize`` (registered destinations and their
positions, a snapshot's rebuild floor) lives in :mod:`pgpoll.sink`, where both
reach it. Every change it makes to an output is fenced by the commit log, like
``ingest``'s batches.
"""
