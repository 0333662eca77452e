"""Where an output's bytes live: the ``OutputFs`` Protocol and its doors to a local disk, an object store and Hadoop.

``output_fs`` (the Protocol the commit log, publishing, leases and snapshots are written against),
``filesystem`` (``open_output``: the one place that picks an implementation), ``local`` and
``local_files`` (a local disk: atomic create-if-absent, renames), ``object_store`` (S3, GCS and Azure
through obstore: conditional ``PUT`` as the fence), ``arrow_store`` (a ``pyarrow.fs`` over the same
client), ``hadoop`` (Hadoop's ``FileSystem`` on the Spark driver), ``config`` (a store's location and
credentials from each cloud's own variables), ``uploads`` (a batch's files written once at their final
keys, with a manifest).

May import: ``pgpoll.errors``, ``pgpoll.lsn``, ``pgpoll.sink.layout`` and its own package. Nothing here
knows the commit log's format or the server: a new store is added here alone (development guide, "Add a
store").
"""
