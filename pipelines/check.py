"""Show the demo's tables and check them against the answer worked out by hand.

Run after the pipeline (``make demo`` does both); exits 1 if a table is wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

import autocdc

# From the greatest sequence per key, whatever the arrival order:
#   1 Alice: insert@1 < update@5            -> Alice, Lyon
#   2 Bob:   insert@2 < delete@6            -> gone
#   3 Carol: insert@3 < delete@7 < insert@9 -> Carol, Milan
#   4 Dan:   insert@4 < update@8            -> Dan, Bergen
#   5 Eve:   insert@10                      -> Eve, Madrid
#   NULL id                                 -> quarantine (AUTOCDC_NULL_KEY)
CURRENT = [(1, "Alice", "Lyon"), (3, "Carol", "Milan"), (4, "Dan", "Bergen"), (5, "Eve", "Madrid")]
HISTORY = [
    (1, "Alice", "Paris", 1, 5),
    (1, "Alice", "Lyon", 5, None),
    (2, "Bob", "Berlin", 2, 6),
    (3, "Carol", "Rome", 3, 7),
    (3, "Carol", "Milan", 9, None),
    (4, "Dan", "Oslo", 4, 8),
    (4, "Dan", "Bergen", 8, None),
    (5, "Eve", "Madrid", 10, None),
]


def main() -> int:
    warehouse = Path(__file__).resolve().parent.parent / "warehouse"
    spark = autocdc.spark_session(warehouse=warehouse)
    current = spark.table("customers").orderBy("id")
    history = spark.table("customers_history").orderBy("id", "__START_AT")
    for df in (current, history, spark.table("customers_per_city").orderBy("city")):
        df.show(truncate=False)
    spark.table("customers__autocdc_quarantine").select("reason", "row").show(truncate=False)
    ok = [tuple(r) for r in current.collect()] == CURRENT
    ok &= [tuple(r) for r in history.collect()] == HISTORY
    print("demo result matches the hand-worked answer" if ok else "demo result is WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
