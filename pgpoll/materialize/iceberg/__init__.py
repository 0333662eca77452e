"""``materialize --format iceberg``: a table's state as an Apache Iceberg table in a pyiceberg catalog.

``state`` (the materializer for Iceberg), ``table`` (pin a snapshot, read its files, commit once),
``catalog`` (which catalog, configured the pyiceberg way, and each table's identifier), ``types``
(PostgreSQL types in Iceberg and the schema changes Iceberg allows; pure).

May import: ``pgpoll.materialize``'s format-free modules, ``pgpoll.materialize.driver``, the key-ordered
layout of ``pgpoll.materialize.delta.files``, ``pgpoll.sink``, ``pgpoll.typed`` and its own package.
"""
