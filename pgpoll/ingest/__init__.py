"""The ingest job: peek a slot inside a Spark task, write Parquet by LSN range, advance after commit."""
