"""Spark wiring: the only package that imports pyspark (session, Arrow batches, the streaming loop)."""
