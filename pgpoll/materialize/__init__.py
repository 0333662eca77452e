"""The current state of every captured table, from the typed changes ingest wrote (``pgpoll materialize``)."""
