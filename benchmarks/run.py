"""Benchmark autocdc against the floor (and Spark's own AUTO CDC) on one machine, one run.

    python benchmarks/run.py --quick     # < 5 minutes, prints the JSON summary
    python benchmarks/run.py             # full run: also writes BENCHMARKS.md and a plot
    python benchmarks/run.py --smoke     # seconds of data: keeps the harness working (CI)

Every system gets the same data, the same SparkSession and settings
(conf/spark-defaults.conf). Per configuration: load the snapshot (untimed), apply the
batches one by one, drop the first as warm-up, report medians of the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import correctness
import measure
import report
import workload
from pyspark.sql import SparkSession
from systems import AutoCdc, Floor
from workload import Workload

import autocdc

HERE = Path(__file__).resolve().parent
TARGETS = {"scd1": 1.3, "scd2": 1.6, "scale_10x": 2.0}


@dataclass(frozen=True)
class Profile:
    """The headline workload (every system, first batch a warm-up, checked against the
    reference) and the scaling points (SCD1, and the floor unless the profile must be
    quick; the session is warm by then, so every batch after the load counts)."""

    headline: Workload
    target_rows: tuple[int, ...]  # with headline.batch_rows
    batch_rows: tuple[int, ...]  # into headline.target_rows
    scaling_batches: int
    spark_pipelines: bool
    scaling_systems: tuple[str, ...] = ("floor", "scd1")


PROFILES = {
    # The headline only: its scaling "curve" is one point, which still runs every code path.
    "smoke": Profile(Workload(200, 50, 2), (200,), (50,), 1, False),
    # Under 5 minutes: one batch per scaling point, no floor there, and no spark-pipelines
    # (its result is a fixed error that costs ~30 s to reach; the full run reports it).
    "quick": Profile(
        Workload(20_000, 5_000, 3), (20_000, 200_000), (5_000, 20_000), 1, False, ("scd1",)
    ),
    "full": Profile(
        Workload(1_000_000, 100_000, 4),
        (1_000_000, 10_000_000),
        (10_000, 100_000, 1_000_000),
        2,
        True,
    ),
}


def run_config(
    spark: SparkSession, work: Path, w: Workload, systems: list[str], headline: bool
) -> dict[str, dict[str, Any]]:
    """Generate one workload, run each system on it; per-system summary (and correctness)."""
    tag = f"n{w.target_rows}-b{w.batch_rows}"
    data = work / "data" / tag
    snapshot_dir, batch_dirs = workload.write(spark, w, data)
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    out: dict[str, dict[str, Any]] = {}
    expected = correctness.changes(w, batch_dirs) if headline else None
    for name in systems:
        system = (
            Floor(warehouse, f"floor_{tag}".replace("-", "_"))
            if name == "floor"
            else AutoCdc(warehouse, int(name[-1]), f"autocdc_{name}_{tag}".replace("-", "_"))
        )
        started = time.perf_counter()
        system.load(spark.read.parquet(str(snapshot_dir)))
        load_s = time.perf_counter() - started
        costs = [
            measure.measure(
                spark,
                system.table_dirs(),
                lambda s=system, d=d: s.apply(spark.read.parquet(str(d))),
            )
            for d in batch_dirs
        ]
        summary = measure.summarize(costs[1:] if headline else costs, w.batch_rows)
        summary["load_s"] = round(load_s, 3)
        summary["per_batch_s"] = [c.seconds for c in costs]
        if expected is not None:
            scd = 2 if name == "scd2" else 1
            summary["correctness"] = correctness.check(
                spark, w, snapshot_dir, system.result(spark), scd, expected
            )
        out[name] = summary
        print(f"  {tag} {name}: {json.dumps(summary, default=str)}", file=sys.stderr, flush=True)
    return out


def machine(spark: SparkSession) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": jvm.java.lang.System.getProperty("java.version"),
        "spark": spark.version,
        "spark_master": spark.conf.get("spark.master"),
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "driver_memory": spark.conf.get("spark.driver.memory", "default"),
    }


def _floor_s(points: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {n: v["floor"]["median_s"] for n, v in points.items() if "floor" in v}


def summarize(profile: Profile, head: dict[str, dict[str, Any]], scaling: dict) -> dict:
    floor = head["floor"]["median_s"]
    by_target = scaling["target_rows"]
    by_size = [by_target[str(n)]["scd1"]["median_s"] for n in profile.target_rows]
    scale = round(by_size[-1] / by_size[0], 2)  # largest target over smallest
    batch_s = {n: v["scd1"]["median_s"] for n, v in scaling["batch_rows"].items()}
    heap = {n: v["scd1"]["heap_peak_mb"] for n, v in scaling["batch_rows"].items()}
    ratios = {
        "scd1_vs_floor": round(head["scd1"]["median_s"] / floor, 2),
        "scd2_vs_floor": round(head["scd2"]["median_s"] / floor, 2),
        "scale_10x": scale,
    }
    return {
        "floor_s": floor,
        "scd1_s": head["scd1"]["median_s"],
        "scd2_s": head["scd2"]["median_s"],
        "rows_per_s_scd1": head["scd1"]["rows_per_s"],
        "rows_per_s_floor": head["floor"]["rows_per_s"],
        "ratios": ratios,
        "targets_met": {
            "scd1_le_1.3x_floor": ratios["scd1_vs_floor"] <= TARGETS["scd1"],
            "scd2_le_1.6x_floor": ratios["scd2_vs_floor"] <= TARGETS["scd2"],
            "10x_target_le_2x_time": ratios["scale_10x"] <= TARGETS["scale_10x"],
            "heap_by_batch_rows_mb": heap,
        },
        "scaling": {
            "scd1_s_by_target_rows": {n: v["scd1"]["median_s"] for n, v in by_target.items()},
            "floor_s_by_target_rows": _floor_s(by_target),
            "scd1_s_by_batch_rows": batch_s,
            "floor_s_by_batch_rows": _floor_s(scaling["batch_rows"]),
        },
        "correct": {name: s["correctness"]["correct"] for name, s in head.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, < 5 minutes")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, checks the harness")
    parser.add_argument("--work", type=Path, default=Path("/tmp/autocdc-bench"))
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    profile = PROFILES[mode]
    headline = replace(profile.headline, seed=args.seed)

    shutil.rmtree(args.work, ignore_errors=True)
    started = time.perf_counter()
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    head = run_config(spark, args.work, headline, ["floor", "scd1", "scd2"], headline=True)
    scaling: dict[str, dict[str, Any]] = {"target_rows": {}, "batch_rows": {}}
    points = [(n, headline.batch_rows, "target_rows", n) for n in profile.target_rows] + [
        (headline.target_rows, b, "batch_rows", b) for b in profile.batch_rows
    ]
    for n, b, axis, value in points:
        if (n, b) == (headline.target_rows, headline.batch_rows):
            result = head
        else:
            w = replace(headline, target_rows=n, batch_rows=b, batches=profile.scaling_batches)
            result = run_config(spark, args.work, w, [*profile.scaling_systems], headline=False)
        scaling[axis][str(value)] = result
    env = machine(spark)
    spark.stop()

    pipelines: dict[str, Any] = {"status": "skipped"}
    if profile.spark_pipelines:
        import spark_pipelines  # only the quick and full runs start spark-pipelines

        data = args.work / "data" / f"n{headline.target_rows}-b{headline.batch_rows}"
        pipelines = spark_pipelines.run(
            [data / "snapshot", *sorted(data.glob("batch-*"))],
            args.work / "spark-pipelines",
            schema=headline.ddl,
        )

    summary = summarize(profile, head, scaling)
    summary["spark_pipelines"] = {
        k: pipelines.get(k) for k in ("status", "error", "seconds_per_batch", "format")
    }
    summary["mode"] = mode
    summary["total_s"] = round(time.perf_counter() - started, 1)
    detail = {
        "summary": summary,
        "machine": env,
        "workload": headline.describe(),
        "headline": head,
        "scaling": scaling,
        "spark_pipelines": pipelines,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{mode}.json").write_text(json.dumps(detail, indent=2, default=str))
    docs = HERE if mode == "full" else args.out
    report.write(detail, docs / "BENCHMARKS.md", docs / "scaling.png")
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
