"""The dead-letter table: rows that could not be applied, kept whole with a reason.

A batch's rows are those not already quarantined with the same flow, reason and row (a
change resent later is kept once), and they are appended with the batch's commit (see
:mod:`autocdc.engine.commit`), so a batch replayed after a crash adds nothing twice.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from autocdc.engine import tables
from autocdc.engine.stage import REASON, SEQ
from autocdc.engine.tables import col

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


def create(spark: SparkSession, table: str) -> None:
    tables.create(spark, table, SCHEMA)


def new_rows(spark: SparkSession, table: str, quarantined: DataFrame) -> DataFrame:
    """``quarantined`` without the rows the table already holds (by flow, reason, row)."""
    distinct = quarantined.dropDuplicates(["flow", "reason", "row"])
    if not tables.exists(spark, table):
        return distinct
    held = tables.read(spark, table).select("flow", "reason", "row")
    return distinct.join(held, ["flow", "reason", "row"], "left_anti").select(*SCHEMA.names)


def append(spark: SparkSession, table: str, quarantined: DataFrame) -> None:
    """Append the rows of ``quarantined`` the table does not hold yet (a staged
    micro-batch's: idempotent by content, with no batch commit to ride on)."""
    rows = new_rows(spark, table, quarantined).localCheckpoint()
    if not rows.isEmpty():
        rows.write.format("delta").mode("append").save(tables.default_location(spark, table))
