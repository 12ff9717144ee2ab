"""Demo pipeline: a messy change feed into a clean `customers` table.

Run it with ``make demo``, ``python -m autocdc run pipelines/demo.py`` or
``spark-submit pipelines/demo.py``. Every run starts from empty tables.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import autocdc

TARGET = "customers"

SCHEMA = StructType(
    [
        StructField("id", IntegerType()),
        StructField("name", StringType()),
        StructField("city", StringType()),
        StructField("op", StringType()),
        StructField("seq", LongType()),
    ]
)

# Three micro-batches, in arrival order. Nothing arrives in sequence order.
BATCHES = [
    [
        (1, "Alice", "Lyon", "U", 5),  # update arrives before the insert it follows
        (4, "Dan", "Bergen", "U", 8),
        (2, None, None, "D", 6),  # delete arrives before the insert it follows
        (1, "Alice", "Lyon", "U", 5),  # exact duplicate
        (3, "Carol", "Rome", "I", 3),
        (4, "Dan", "Oslo", "I", 4),  # older than Dan's update in the same batch
    ],
    [
        (1, "Alice", "Paris", "I", 1),  # older than the update already applied
        (2, "Bob", "Berlin", "I", 2),  # older than Bob's delete: Bob never appears
        (3, None, None, "D", 7),  # Carol is deleted
        (None, "Ghost", "Nowhere", "I", 11),  # NULL key: quarantined, the batch goes on
        (5, "Eve", "Madrid", "I", 10),
    ],
    [
        (3, "Carol", "Milan", "I", 9),  # reinsert after the delete
        (4, "Dan", "Oslo", "I", 4),  # replayed old row
        (5, "Eve", "Madrid", "I", 10),  # replayed row, already applied
        (2, None, None, "D", 6),  # replayed delete
    ],
]

# Worked out by hand, per key, from the greatest sequence alone:
#   1 Alice: insert@1 < update@5            -> Alice, Lyon
#   2 Bob:   insert@2 < delete@6            -> gone
#   3 Carol: insert@3 < delete@7 < insert@9 -> Carol, Milan
#   4 Dan:   insert@4 < update@8            -> Dan, Bergen
#   5 Eve:   insert@10                      -> Eve, Madrid
#   NULL id                                 -> quarantine (AUTOCDC_NULL_KEY)
EXPECTED = [(1, "Alice", "Lyon"), (3, "Carol", "Milan"), (4, "Dan", "Bergen"), (5, "Eve", "Madrid")]


def main(spark: SparkSession) -> None:
    flow = autocdc.AutoCdcFlow(
        target=TARGET,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=1,
    )
    flow.full_refresh(spark)  # every run starts from empty tables
    for rows in BATCHES:
        metrics = flow.apply(spark.createDataFrame(rows, SCHEMA)).as_dict()
        flow_name, batch_id = metrics.pop("flow"), metrics.pop("batch_id")
        print(f"{flow_name} batch {batch_id}: " + " ".join(f"{k}={v}" for k, v in metrics.items()))

    result = spark.table(TARGET).orderBy("id")
    result.show()
    spark.table(flow.quarantine_table).select("reason", "row").show(truncate=False)

    actual = [tuple(row) for row in result.collect()]
    verdict = "matches" if actual == EXPECTED else f"DIFFERS, got {actual}"
    print(f"expected (by hand): {EXPECTED} -> {verdict}")


if __name__ == "__main__":
    main(autocdc.spark_session())
