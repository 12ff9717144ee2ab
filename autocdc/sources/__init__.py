"""Change sources: Spark streaming sources and helpers that turn a database's change log
into change rows a flow applies (``_CHANGE_TYPE``, ``_CHANGE_SEQUENCE_NUMBER``, values).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from autocdc.sources.postgres import PostgresSource


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("postgres_cdc")`` available in this session
    (``autocdc.spark_session`` does it for you)."""
    spark.dataSource.register(PostgresSource)
