"""Change sources: a Spark streaming source over PostgreSQL's log, and helpers that turn
what a capture tool emits into change rows an AutoCdcFlow applies (the BigQuery CDC shape:
row columns, ``_CHANGE_TYPE``, ``_CHANGE_SEQUENCE_NUMBER``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyspark.sql import SparkSession

from autocdc import runtime
from autocdc.sources.postgres import PostgresSource


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("postgres_cdc")`` available in this session
    (``autocdc.spark_session`` does it for you)."""
    spark.dataSource.register(PostgresSource)


def spark_session(
    warehouse: str | os.PathLike[str] | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The engine's session (:func:`autocdc.runtime.spark_session`: local Spark,
    Delta, the engine's settings overridden by ``conf/``) with autocdc's sources
    registered. Registration lives here, not in the engine: the engine imports nothing
    above it.

    >>> spark = spark_session(warehouse="/tmp/wh")            # doctest: +SKIP
    """
    spark = runtime.spark_session(warehouse, conf)
    register(spark)
    return spark
