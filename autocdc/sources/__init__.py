"""Change sources: a Spark streaming source over PostgreSQL's log, and helpers that turn
what a capture tool emits into change rows an AutoCdcFlow applies (the BigQuery CDC shape:
row columns, ``_CHANGE_TYPE``, ``_CHANGE_SEQUENCE_NUMBER``).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from autocdc.sources.postgres import PostgresSource


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("postgres_cdc")`` available in this session
    (``autocdc.spark_session`` does it for you)."""
    spark.dataSource.register(PostgresSource)
