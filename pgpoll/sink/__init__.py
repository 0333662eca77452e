"""The sink: where batches land (Parquet by LSN range) and pgpoll's own commit log."""
