"""Each system's table after the run, against the reference fold of tests/support/reference.py.

Keys no batch touched must still hold their snapshot row, which Spark checks with
``exceptAll``; the keys the batches touched (at most batches x batch size) are folded
by the pure-Python reference model and compared row by row.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from workload import Workload, snapshot_values

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from reference import DELETE, UPSERT, Change, fold_scd1, fold_scd2

from autocdc.engine.spec import END_AT, START_AT

KEY = "id"


def changes(workload: Workload, batch_dirs: Iterable[Path]) -> tuple[set[int], list[Change]]:
    """The keys the batches touch, and every change of those keys (snapshot included)."""
    batched: list[Change] = []
    for path in batch_dirs:
        for row in pq.read_table(path).to_pylist():
            values = tuple(row[c] for c in workload.columns)
            if row["op"] == "D":
                batched.append(Change(row[KEY], row["seq"], DELETE))
            else:
                batched.append(Change(row[KEY], row["seq"], UPSERT, values))
    touched = {c.key for c in batched}
    snapshot = [
        Change(k, 0, UPSERT, snapshot_values(workload, k))
        for k in touched
        if k < workload.target_rows
    ]
    return touched, snapshot + batched


def _untouched_mismatches(
    result: DataFrame, snapshot: DataFrame, touched: DataFrame, columns: list[str]
) -> int:
    got = result.join(touched, KEY, "left_anti").select(KEY, *columns)
    want = snapshot.join(touched, KEY, "left_anti").select(KEY, *columns)
    return got.exceptAll(want).count() + want.exceptAll(got).count()


def check(
    spark: SparkSession,
    workload: Workload,
    snapshot_dir: Path,
    result: DataFrame,
    scd_type: int,
    touched_changes: tuple[set[int], list[Change]],
) -> dict[str, Any]:
    """Rows that differ from the reference (0 means correct), split touched/untouched.

    ``touched_changes`` is :func:`changes` of the run, computed once for all systems.
    """
    touched, all_changes = touched_changes
    touched_df = spark.createDataFrame([(k,) for k in sorted(touched)], f"{KEY} bigint")
    snapshot = spark.read.parquet(str(snapshot_dir))
    columns = workload.columns
    if scd_type == 2:
        snapshot = snapshot.select(
            KEY, *columns, F.lit(0).cast("long").alias(START_AT), F.lit(None).alias(END_AT)
        )
        columns = [*columns, START_AT, END_AT]
    untouched = _untouched_mismatches(result, snapshot, touched_df, columns)

    rows = result.join(touched_df, KEY, "left_semi").collect()
    if scd_type == 1:
        want1 = fold_scd1(all_changes)
        got1 = {r[KEY]: tuple(r[c] for c in workload.columns) for r in rows}
        bad = {k for k in want1.keys() | got1.keys() if want1.get(k) != got1.get(k)}
        touched_bad = len(bad)
    else:
        want2 = fold_scd2(all_changes)
        got2 = {
            (r[KEY], tuple(r[c] for c in workload.columns), r[START_AT], r[END_AT]) for r in rows
        }
        touched_bad = len(want2 ^ got2)
    return {
        "correct": touched_bad == 0 and untouched == 0,
        "mismatched_touched": touched_bad,
        "mismatched_untouched": untouched,
        "keys_touched": len(touched),
    }
