"""Key clustering of the target: small batches into a large table, clustered by key or not.

    python benchmarks/clustering.py                    # 1M rows, batches of 100 changes
    python benchmarks/clustering.py --rows 10000000 --files 256

Four systems on the same data: the floor (latest change per key, one MERGE) and autocdc
SCD type 1, each into a plain target and into one clustered by its key (``CLUSTER BY
(id)``; autocdc: ``cluster_by=["id"]``), which is then OPTIMIZEd after the load, as a user
would run it. OPTIMIZE's file size is set so the table has about ``--files`` files: a
real table of hundreds of GB has that many files of 1 GB, a million rows would be one.
Per system: load and OPTIMIZE (untimed), then the batches one by one, the first a
warm-up; medians, and the last MERGE's scan and rewrite times (Delta's operation metrics).
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import measure
import workload
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from systems import AutoCdc, Floor
from workload import Workload

import autocdc

# Of the last MERGE (Delta's operation metrics; it reports no count of files skipped): the
# time to find the matched rows, to write, and the files it marked rows deleted in.
MERGE_METRICS = ("scanTimeMs", "rewriteTimeMs", "numTargetDeletionVectorsAdded")


class ClusteredFloor(Floor):
    """The floor into a target clustered by its key."""

    def load(self, snapshot: DataFrame) -> None:
        spark = snapshot.sparkSession
        rows = snapshot.drop("seq", "op")
        DeltaTable.create(spark).location(str(self.path)).addColumns(rows.schema).clusterBy(
            "id"
        ).execute()
        rows.write.format("delta").mode("append").save(str(self.path))


class ClusteredAutoCdc(AutoCdc):
    """autocdc into a target clustered by its key."""

    def _flow(self, name: str, **options: object) -> autocdc.AutoCdcFlow:
        return super()._flow(name, cluster_by=["id"], **options)


def table_name(system: Any) -> str:
    return f"delta.`{system.path}`" if isinstance(system, Floor) else system.flow.target


def optimize(spark: SparkSession, table: str, files: int) -> None:
    """OPTIMIZE ``table`` into about ``files`` files (clustering it, if it is clustered)."""
    size = int(spark.sql(f"DESCRIBE DETAIL {table}").first()["sizeInBytes"])
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(max(size // files, 1)))
    try:
        spark.sql(f"OPTIMIZE {table}").collect()
    finally:
        spark.conf.unset("spark.databricks.delta.optimize.maxFileSize")


def last_merge(spark: SparkSession, table: str) -> dict[str, int]:
    """:data:`MERGE_METRICS` of the table's last MERGE."""
    last = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 5").where("operation = 'MERGE'").first()
    metrics = (last and last["operationMetrics"]) or {}
    return {k: int(metrics[k]) for k in MERGE_METRICS if k in metrics}


def run_system(
    spark: SparkSession, system: Any, snapshot: Path, batches: list[Path], files: int
) -> dict[str, Any]:
    system.load(spark.read.parquet(str(snapshot)))
    table = table_name(system)
    optimize(spark, table, files)
    detail = spark.sql(f"DESCRIBE DETAIL {table}").first()
    costs = [
        measure.measure(
            spark, system.table_dirs(), lambda d=d: system.apply(spark.read.parquet(str(d)))
        )
        for d in batches
    ]
    summary = measure.summarize(costs[1:], len(batches))
    return {
        "median_s": summary["median_s"],
        "per_batch_s": [c.seconds for c in costs],
        "jobs_per_batch": summary["jobs_per_batch"],
        "target_files": detail["numFiles"],
        "clustering": list(detail["clusteringColumns"]),
        "last_merge": last_merge(spark, table),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100, help="changes per batch")
    parser.add_argument("--batches", type=int, default=4, help="the first is a warm-up")
    parser.add_argument("--files", type=int, default=64, help="target files after OPTIMIZE")
    parser.add_argument("--work", type=Path, default=Path("/tmp/autocdc-clustering"))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    shutil.rmtree(args.work, ignore_errors=True)
    started = time.perf_counter()
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    w = Workload(args.rows, args.changes, args.batches, seed=args.seed)
    snapshot, batches = workload.write(spark, w, args.work / "data")
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    systems = {
        "floor": Floor(warehouse, "floor"),
        "floor_clustered": ClusteredFloor(warehouse, "floor_clustered"),
        "scd1": AutoCdc(warehouse, 1, "autocdc_scd1"),
        "scd1_clustered": ClusteredAutoCdc(warehouse, 1, "autocdc_scd1_clustered"),
    }
    results = {}
    for name, system in systems.items():
        results[name] = run_system(spark, system, snapshot, batches, args.files)
        print(f"  {name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    spark.stop()

    def ratio(a: str, b: str) -> float:
        return round(results[a]["median_s"] / results[b]["median_s"], 2)

    summary = {
        "workload": {"rows": args.rows, "changes": args.changes, "batches": args.batches},
        "median_s": {name: r["median_s"] for name, r in results.items()},
        "scd1_vs_floor": ratio("scd1", "floor"),
        "scd1_clustered_vs_floor": ratio("scd1_clustered", "floor"),
        "scd1_clustered_vs_floor_clustered": ratio("scd1_clustered", "floor_clustered"),
        "scd1_clustered_vs_scd1": ratio("scd1_clustered", "scd1"),
        "spread_s": {
            n: round(statistics.pstdev(r["per_batch_s"][1:]), 3) for n, r in results.items()
        },
        "systems": results,
        "total_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
