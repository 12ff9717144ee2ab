"""The dead-letter table: rows that could not be applied, kept whole with a reason.

Writes are idempotent by content (an insert-only MERGE on flow, reason and row), so a
batch replayed after a crash does not quarantine its rows twice.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from autocdc.engine import tables
from autocdc.engine.stage import REASON, SEQ, col

SCHEMA = StructType(
    [
        StructField("flow", StringType()),
        StructField("batch_id", LongType()),
        StructField("reason", StringType()),
        StructField("sequence", StringType()),
        StructField("row", StringType()),
        StructField("quarantined_at", TimestampType()),
    ]
)


def rows(rejected: DataFrame, source_columns: list[str], flow: str, batch_id: int) -> DataFrame:
    """Shape rejected rows (source columns + SEQ + REASON) as quarantine rows."""
    return rejected.select(
        F.lit(flow).alias("flow"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        col(REASON).alias("reason"),
        col(SEQ).cast("string").alias("sequence"),
        # Keep NULL fields: a NULL key is often the very reason the row is here. Fields in
        # name order: a row resent with its columns in another order is the same content.
        F.to_json(
            F.struct(*[col(c) for c in sorted(source_columns)]), {"ignoreNullFields": "false"}
        ).alias("row"),
        F.current_timestamp().alias("quarantined_at"),
    )


def write(spark: SparkSession, table: str, quarantined: DataFrame) -> None:
    tables.create(spark, table, SCHEMA)
    (
        tables.delta_table(spark, table)
        .alias("q")
        .merge(
            quarantined.dropDuplicates(["flow", "reason", "row"]).alias("n"),
            "q.flow = n.flow AND q.reason = n.reason AND q.row = n.row",
        )
        .whenNotMatchedInsertAll()
        .execute()
    )
