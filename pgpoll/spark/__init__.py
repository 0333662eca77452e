"""Spark adapters shared by the jobs: the SparkSession factory and its quiet logging."""
