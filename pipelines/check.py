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
    project = Path(__file__).resolve().parent
    log = project / "autocdc-logs" / "autocdc.log"  # the run's log file
    spark = autocdc.spark_session(project.parent / "warehouse", {"autocdc.logFile": str(log)})
    current = spark.table("customers").orderBy("id")
    history = spark.table("customers_history").orderBy("id", "__START_AT")
    quarantine = spark.table("customers__autocdc_quarantine").select("reason", "row")
    for title, df in [
        ("customers: SCD type 1, the latest row per key", current),
        ("customers_history: SCD type 2, every version of each key", history),
        (
            "customers_per_city: a materialized view over customers",
            spark.table("customers_per_city").orderBy("city"),
        ),
        ("customers__autocdc_quarantine: the rows that could not be applied", quarantine),
    ]:
        print(f"\n{title}")
        df.show(truncate=False)
    ok = [tuple(r) for r in current.collect()] == CURRENT
    ok &= [tuple(r) for r in history.collect()] == HISTORY
    print("demo result matches the hand-worked answer" if ok else "demo result is WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
