"""PostgreSQL side: connections, slots, publications, catalog queries. The only package that talks to the server.

``connection`` (where to connect, redaction), ``session`` (the pinned settings and the one transaction
helper every value-reading call uses), ``slots`` (create, list, peek, advance), ``catalog``,
``server_state`` (what ``pgpoll status`` asks the server), ``control`` (the ingest driver's connection:
heartbeat, advance, logged retries), ``server_errors`` (psycopg2 errors to pgpoll errors), ``names``,
``publications``, ``preflight``, ``row_filter_check``; ``server_identity`` and ``slot_gap`` (whose history
a slot is on, against the output's), ``new_history`` (what resync needs of a server whose history is not the
output's: WAL past the mark, the transactions a slot skips below it).
"""
