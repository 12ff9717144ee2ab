"""Show the Debezium example's tables and check them against the answer worked out by hand.

Run after the pipeline (from the repository root):
    python -m autocdc run --spec pipelines/debezium/spark-pipeline.yml --full-refresh-all
    python pipelines/debezium/check.py
Exits 1 if a table is wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import autocdc

# customers, in commit order: 1 Paris -> Lyon (committed after the snapshot, lower LSN);
# 2 deleted; 3 Rome -> Milan; 4 Oslo -> Bergen (delivered twice); 5 Madrid; op m quarantined.
CUSTOMERS = [
    (1, "Alice", "Lyon"),
    (3, "Carol", "Milan"),
    (4, "Dan", "Bergen"),
    (5, "Eve", "Madrid"),
]
# products_history: (id, name, stock, current?) by binlog position: lamp 10 -> 9 -> 8 -> 7
# although the last two arrive the other way round; sofa deleted (its version ends).
PRODUCTS = [
    (1, "lamp", 10, False),
    (1, "lamp", 9, False),
    (1, "lamp", 8, False),
    (1, "lamp", 7, True),
    (2, "desk", 5, True),
    (3, "sofa", 2, False),
    (4, "rug", 7, True),
]


def check(spark: SparkSession, show: bool = False) -> bool:
    """True when the example's tables (in the current database) hold the expected rows."""
    customers = spark.table("customers").orderBy("id")
    history = spark.table("products_history").orderBy("id", "__START_AT")
    quarantine = spark.table("customers__autocdc_quarantine").select("reason", "row")
    if show:
        for df in (customers, history, quarantine):
            df.show(truncate=False)
    versions = history.select("id", "name", "stock", F.col("__END_AT").isNull())
    return (
        [tuple(r) for r in customers.collect()] == CUSTOMERS
        and [tuple(r) for r in versions.collect()] == PRODUCTS
        and [r.reason for r in quarantine.collect()] == ["AUTOCDC_MALFORMED_RECORD"]
    )


def main() -> int:
    spark = autocdc.spark_session(warehouse=Path(__file__).resolve().parent / "warehouse")
    ok = check(spark, show=True)
    print("Debezium example matches the hand-worked answer" if ok else "result is WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
