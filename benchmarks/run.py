"""Benchmark autocdc against the floor (and Spark's own AUTO CDC) on one machine, one run.

    python benchmarks/run.py --quick     # < 5 minutes, prints the JSON summary
    python benchmarks/run.py             # full run: also writes BENCHMARKS.md and a plot
    python benchmarks/run.py --smoke     # seconds of data: keeps the harness working (CI)
    python benchmarks/run.py --snapshot  # snapshot flows only (with --quick, --smoke: smaller)

Every system gets the same data, the same SparkSession and settings (the engine's, in
autocdc/runtime/defaults/). Per configuration: load the snapshot (untimed), apply the
batches one by one, drop the first as warm-up, report medians of the rest. The headline
ends with a tail of small batches (what a batch costs when there is little to do); the
SCD2 history workload keeps changing the same keys (does the cost follow the history?).
The partial-upsert measure compares, on a partial target, a batch of full rows with a
batch of partial upserts of the same keys.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
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
from pyspark.sql import functions as F
from systems import SEQ, AutoCdc, DiffMerge, Floor, HandScd2, SnapshotAutoCdc, SnapshotMerge
from workload import SnapshotWorkload, Workload

import autocdc

HERE = Path(__file__).resolve().parent
TARGETS = {
    "scd1": 1.3,
    "scd2": 1.6,
    "scd2_vs_hand": 1.3,  # against the SCD2 MERGE Delta's documentation writes by hand
    "scale_10x": 2.0,
    "bytes": 1.5,  # bytes written per batch, all autocdc tables over the floor's
    "scd1_aux": 0.5,  # state + quarantine table size over the target's, after the headline
    "small_scd1": 1.5,
    "small_scd2": 2.0,
    "scd2_history": 1.3,
}
SMALL_BATCH_ROWS = 100
HISTORY_BATCHES = 12  # batch k finds k - 1 earlier batches on the same keys
PARTIAL_COLUMNS = ["c0", "c1"]  # what the partial producer sends: 2 of the 8 payload columns


def headline_workload(
    target_rows: int, batch_rows: int, batches: int, small_batches: int
) -> Workload:
    """The headline batches, then small_batches of SMALL_BATCH_ROWS changes into the same
    tables: no second load of the headline target, and no warm-up (the tables are warm)."""
    return Workload(
        target_rows, batch_rows, batches, tail_batches=small_batches, tail_rows=SMALL_BATCH_ROWS
    )


def history(target_rows: int, batch_rows: int) -> Workload:
    """Batches of updates and deletes (no inserts) of the same batch_rows keys."""
    return Workload(target_rows, batch_rows, HISTORY_BATCHES, insert_share=0.0, hot_keys=batch_rows)


@dataclass(frozen=True)
class Profile:
    """The headline workload (every system, first batch a warm-up, then the small batches,
    checked against the reference), the scaling points (SCD1, and the floor unless the
    profile must be quick; the session is warm by then, so every batch after the load
    counts; the small batches are the batch_rows point SMALL_BATCH_ROWS) and the SCD2
    history workload (None: not run)."""

    headline: Workload
    target_rows: tuple[int, ...]  # with headline.batch_rows
    batch_rows: tuple[int, ...]  # into headline.target_rows
    scaling_batches: int
    spark_pipelines: bool
    history: Workload | None
    scaling_systems: tuple[str, ...] = ("floor", "scd1")


PROFILES = {
    # The headline (its scaling "curve" is one point plus the small batches) and a tiny SCD2
    # history: every code path, in minutes of fixed overhead on seconds of data.
    "smoke": Profile(headline_workload(200, 50, 2, 1), (200,), (50,), 1, False, history(100, 20)),
    # Under 5 minutes: one batch per scaling point, no floor there, no spark-pipelines
    # (its result is a fixed error that costs ~30 s to reach; the full run reports it), and
    # no SCD2 history: its 13 applies cost 2 to 3 minutes whatever the size (fixed overhead).
    # The small batches stand in for a second batch_rows point (20,000 cost ~40 s).
    "quick": Profile(
        headline_workload(20_000, 5_000, 3, 2),
        (20_000, 200_000),
        (5_000,),
        1,
        False,
        None,
        ("scd1",),
    ),
    "full": Profile(
        headline_workload(1_000_000, 100_000, 4, 3),
        (1_000_000, 10_000_000),
        (10_000, 100_000, 1_000_000),
        2,
        True,
        history(10_000, 1_000),
    ),
}


def partial_vs_full(spark: SparkSession, work: Path, headline: Workload) -> dict[str, Any]:
    """Cost of a batch of partial upserts against a full-row batch of the same keys, both
    into one partial target (SCD1) loaded with the headline's snapshot.

    Batches of updates only (no inserts, deletes, late changes or duplicates): a warm-up
    full-row batch, then a full-row batch (measured), then the same rows as partial
    upserts of PARTIAL_COLUMNS with newer sequences (measured), from a second flow that
    reads only those columns, as a producer of them would send them."""
    w = replace(
        headline,
        batches=2,
        tail_batches=0,
        insert_share=0.0,
        delete_share=0.0,
        late_share=0.0,
        duplicate_share=0.0,
    )
    snapshot_dir, (warmup, full) = workload.write(spark, w, work / "data" / "partial")
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    system = AutoCdc(warehouse, 1, "autocdc_partial", partial=True)
    system.load(spark.read.parquet(str(snapshot_dir)))
    system.apply(spark.read.parquet(str(warmup)))
    rows = spark.read.parquet(str(full))
    later = rows.agg(F.max(SEQ)).first()[0] + 1
    narrow = rows.select("id", (F.col(SEQ) + later).alias(SEQ), "op", *PARTIAL_COLUMNS)
    partial = system.partial_flow(PARTIAL_COLUMNS)
    costs = {
        "full": measure.measure(spark, system.table_dirs(), lambda: system.apply(rows)),
        "partial": measure.measure(spark, system.table_dirs(), lambda: partial.apply(narrow)),
    }
    out: dict[str, Any] = {"rows": w.batch_rows, "columns_set": PARTIAL_COLUMNS}
    for kind, cost in costs.items():
        out[f"{kind}_s"], out[f"{kind}_bytes"], out[f"{kind}_jobs"] = (
            cost.seconds,
            cost.bytes,
            cost.jobs,
        )
    out["seconds_ratio"] = round(out["partial_s"] / out["full_s"], 2)
    out["bytes_ratio"] = round(out["partial_bytes"] / out["full_bytes"], 2)
    print(f"  partial vs full: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def load_and_apply(
    spark: SparkSession, system: Any, load: Path, inputs: list[Path]
) -> tuple[float, list[measure.BatchCost]]:
    """Load the parquet ``load`` into ``system`` (its seconds), then apply each of
    ``inputs`` in turn, measured."""
    started = time.perf_counter()
    system.load(spark.read.parquet(str(load)))
    load_s = time.perf_counter() - started
    costs = [
        measure.measure(
            spark, system.table_dirs(), lambda d=d: system.apply(spark.read.parquet(str(d)))
        )
        for d in inputs
    ]
    return load_s, costs


def run_config(
    spark: SparkSession,
    work: Path,
    w: Workload,
    systems: list[str],
    warmup: bool,
    check: bool = False,
) -> dict[str, dict[str, Any]]:
    """Generate one workload, run each system on it; per-system summary (and correctness).

    Every summary holds the tables' Delta snapshot sizes after the last batch, and that of
    the tail batches (every one counts) under "small"."""
    tag = f"n{w.target_rows}-b{w.batch_rows}" + (f"-k{w.hot_keys}" if w.hot_keys else "")
    data = work / "data" / tag
    snapshot_dir, batch_dirs = workload.write(spark, w, data)
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    out: dict[str, dict[str, Any]] = {}
    expected = correctness.changes(w, batch_dirs) if check else None
    for name in systems:
        table = f"{name}_{tag}".replace("-", "_")
        if name == "floor":
            system: Any = Floor(warehouse, table)
        elif name == "merge_scd2":
            system = HandScd2(warehouse, table)
        else:
            system = AutoCdc(warehouse, int(name[-1]), f"autocdc_{table}")
        load_s, costs = load_and_apply(spark, system, snapshot_dir, batch_dirs)
        regular = costs[: w.batches]
        summary = measure.summarize(regular[1:] if warmup else regular, w.batch_rows)
        if w.tail_batches:
            summary["small"] = measure.summarize(costs[w.batches :], w.tail_rows)
        summary["load_s"] = round(load_s, 3)
        summary["per_batch_s"] = [c.seconds for c in costs]
        sizes = system.snapshot_bytes(spark)
        summary["snapshot_bytes"] = sizes
        aux = sum(sizes.values()) - sizes["target"]
        summary["aux_vs_target"] = round(aux / sizes["target"], 3)
        if expected is not None:
            scd = 2 if name in ("scd2", "merge_scd2") else 1
            summary["correctness"] = correctness.check(
                spark, w, snapshot_dir, system.result(spark), scd, expected
            )
        out[name] = summary
        print(f"  {tag} {name}: {json.dumps(summary, default=str)}", file=sys.stderr, flush=True)
    return out


# Snapshot flows: a table, then full snapshots with 1% of its row count changed each.
SNAPSHOTS = {
    "smoke": SnapshotWorkload(2_000, 3),
    "quick": SnapshotWorkload(100_000, 4),
    "full": SnapshotWorkload(1_000_000, 4),
}


def run_snapshots(spark: SparkSession, work: Path, w: SnapshotWorkload) -> dict[str, Any]:
    """Each system loads snapshot 0 (untimed), then takes the next ones in turn (the bare
    MERGE their diffs, computed beforehand); the first is a warm-up, medians of the rest.
    Each must end equal to the last snapshot (its current rows, for SCD2)."""
    snapshots, diffs = workload.write_snapshots(spark, w, work / "data" / "snapshots")
    warehouse = Path(spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:"))
    systems = {
        "merge_diff": DiffMerge(warehouse),
        "merge_snapshot": SnapshotMerge(warehouse),
        "snapshot_scd1": SnapshotAutoCdc(warehouse, 1),
        "snapshot_scd2": SnapshotAutoCdc(warehouse, 2),
    }
    last = spark.read.parquet(str(snapshots[-1]))
    out: dict[str, Any] = {}
    for name, system in systems.items():
        inputs = diffs if name == "merge_diff" else snapshots[1:]
        load_s, costs = load_and_apply(spark, system, snapshots[0], inputs)
        summary = measure.summarize(costs[1:], w.changed_rows)
        summary["load_s"] = round(load_s, 3)
        summary["per_snapshot_s"] = [c.seconds for c in costs]
        got = system.result(spark).select(*last.columns)
        summary["correct"] = got.exceptAll(last).isEmpty() and last.exceptAll(got).isEmpty()
        out[name] = summary
        print(f"  snapshots {name}: {json.dumps(summary)}", file=sys.stderr, flush=True)
    floor = out["merge_diff"]
    return {
        "seconds": {name: s["median_s"] for name, s in out.items()},
        "vs_merge_diff": {name: _ratio(s, floor) for name, s in out.items()},
        "jobs_per_snapshot": {name: s["jobs_per_batch"] for name, s in out.items()},
        "correct": {name: s["correct"] for name, s in out.items()},
        "systems": out,
    }


def _commit() -> str:
    """The engine's commit, with ``+dirty`` when the work tree differs from it: the record
    names what it measured."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=HERE, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--", "../autocdc") else "")


def machine(spark: SparkSession) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
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


def _ratio(a: dict[str, Any], b: dict[str, Any], key: str = "median_s") -> float:
    return round(a[key] / b[key], 2)


def history_10_vs_1(seconds: list[float]) -> float:
    """Median seconds of batches 11-12 (10 and 11 earlier batches on the same keys) over
    batches 2-3 (1 and 2 earlier); batch 1, the first after the load, is a warm-up."""
    return round(statistics.median(seconds[10:12]) / statistics.median(seconds[1:3]), 2)


def summarize(
    profile: Profile, head: dict[str, dict[str, Any]], scaling: dict, hist: dict | None
) -> dict:
    floor = head["floor"]["median_s"]
    small = {name: s["small"] for name, s in head.items()}
    history_ratio = history_10_vs_1(hist["scd2"]["per_batch_s"]) if hist else None
    by_target = scaling["target_rows"]
    by_size = [by_target[str(n)]["scd1"]["median_s"] for n in profile.target_rows]
    scale = round(by_size[-1] / by_size[0], 2)  # largest target over smallest
    by_batch = dict(sorted(scaling["batch_rows"].items(), key=lambda kv: int(kv[0])))
    batch_s = {n: v["scd1"]["median_s"] for n, v in by_batch.items()}
    heap = {n: v["scd1"]["heap_peak_mb"] for n, v in by_batch.items()}
    ratios = {
        "scd1_vs_floor": _ratio(head["scd1"], head["floor"]),
        "scd2_vs_floor": _ratio(head["scd2"], head["floor"]),
        "scd2_vs_hand_scd2": _ratio(head["scd2"], head["merge_scd2"]),
        "small_scd2_vs_hand_scd2": _ratio(small["scd2"], small["merge_scd2"]),
        "scale_10x": scale,
        "scd1_bytes_vs_floor": _ratio(head["scd1"], head["floor"], "bytes_per_batch"),
        "scd2_bytes_vs_floor": _ratio(head["scd2"], head["floor"], "bytes_per_batch"),
        "scd1_aux_vs_target": head["scd1"]["aux_vs_target"],
        "scd2_aux_vs_target": head["scd2"]["aux_vs_target"],
        "small_scd1_vs_floor": _ratio(small["scd1"], small["floor"]),
        "small_scd2_vs_floor": _ratio(small["scd2"], small["floor"]),
        "scd2_history_10_vs_1": history_ratio,
    }
    return {
        "floor_s": floor,
        "scd1_s": head["scd1"]["median_s"],
        "scd2_s": head["scd2"]["median_s"],
        "rows_per_s_scd1": head["scd1"]["rows_per_s"],
        "rows_per_s_floor": head["floor"]["rows_per_s"],
        "jobs_per_batch": {name: s["jobs_per_batch"] for name, s in head.items()},
        "commits_per_batch": {name: s["commits_per_batch"] for name, s in head.items()},
        "small_commits_per_batch": {name: s["commits_per_batch"] for name, s in small.items()},
        "small_s": {name: s["median_s"] for name, s in small.items()},
        "small_jobs_per_batch": {name: s["jobs_per_batch"] for name, s in small.items()},
        # Where an autocdc batch's time goes (medians of its metrics' steps).
        "steps_s": {name: s["steps_s"] for name, s in head.items() if s["steps_s"]},
        "small_steps_s": {name: s["steps_s"] for name, s in small.items() if s["steps_s"]},
        "scd2_history_per_batch_s": hist["scd2"]["per_batch_s"] if hist else None,
        "ratios": ratios,
        "targets_met": {
            "scd1_le_1.3x_floor": ratios["scd1_vs_floor"] <= TARGETS["scd1"],
            "scd2_le_1.6x_floor": ratios["scd2_vs_floor"] <= TARGETS["scd2"],
            "scd2_le_1.3x_hand_scd2": ratios["scd2_vs_hand_scd2"] <= TARGETS["scd2_vs_hand"],
            "10x_target_le_2x_time": ratios["scale_10x"] <= TARGETS["scale_10x"],
            "scd1_bytes_le_1.5x_floor": ratios["scd1_bytes_vs_floor"] <= TARGETS["bytes"],
            "scd2_bytes_le_1.5x_floor": ratios["scd2_bytes_vs_floor"] <= TARGETS["bytes"],
            "scd1_aux_le_0.5x_target": ratios["scd1_aux_vs_target"] <= TARGETS["scd1_aux"],
            "small_scd1_le_1.5x_floor": ratios["small_scd1_vs_floor"] <= TARGETS["small_scd1"],
            "small_scd2_le_2x_floor": ratios["small_scd2_vs_floor"] <= TARGETS["small_scd2"],
            "scd2_history_10_vs_1_le_1.3x": None
            if history_ratio is None
            else history_ratio <= TARGETS["scd2_history"],
            "heap_by_batch_rows_mb": heap,
        },
        "scaling": {
            "scd1_s_by_target_rows": {n: v["scd1"]["median_s"] for n, v in by_target.items()},
            "floor_s_by_target_rows": _floor_s(by_target),
            "scd1_s_by_batch_rows": batch_s,
            "floor_s_by_batch_rows": _floor_s(by_batch),
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
    parser.add_argument(
        "--history",
        action="store_true",
        help="--quick: also the SCD2 history measure (1,000 rows, batches of 100; ~3 more min)",
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="snapshot flows only: 1M rows, 1%% changed per snapshot (--quick: 100k, "
        "--smoke: 2,000), against a bare MERGE of the same diff; writes out/snapshot-MODE.json",
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    profile = PROFILES[mode]
    headline = replace(profile.headline, seed=args.seed)

    shutil.rmtree(args.work, ignore_errors=True)
    started = time.perf_counter()
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    if args.snapshot:
        snapshot_w = replace(SNAPSHOTS[mode], seed=args.seed)
        result = run_snapshots(spark, args.work, snapshot_w)
        result["workload"], result["machine"] = snapshot_w.describe(), machine(spark)
        result["total_s"] = round(time.perf_counter() - started, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"snapshot-{mode}.json").write_text(json.dumps(result, indent=2))
        print(json.dumps({k: v for k, v in result.items() if k != "systems"}, indent=2))
        return 0
    all_systems = ["floor", "scd1", "scd2", "merge_scd2"]
    head = run_config(spark, args.work, headline, all_systems, warmup=True, check=True)
    scaling: dict[str, dict[str, Any]] = {"target_rows": {}, "batch_rows": {}}
    points = [(n, headline.batch_rows, "target_rows", n) for n in profile.target_rows] + [
        (headline.target_rows, b, "batch_rows", b) for b in profile.batch_rows
    ]
    for n, b, axis, value in points:
        if (n, b) == (headline.target_rows, headline.batch_rows):
            result = head
        else:
            w = replace(
                headline,
                target_rows=n,
                batch_rows=b,
                batches=profile.scaling_batches,
                tail_batches=0,
            )
            result = run_config(spark, args.work, w, [*profile.scaling_systems], warmup=False)
        scaling[axis][str(value)] = result
    scaling["batch_rows"][str(SMALL_BATCH_ROWS)] = {n: s["small"] for n, s in head.items()}
    history_w = profile.history or (history(1_000, 100) if args.history else None)
    history_w = replace(history_w, seed=args.seed) if history_w else None
    hist = run_config(spark, args.work, history_w, ["scd2"], warmup=True) if history_w else None
    partial = partial_vs_full(spark, args.work, headline)
    env = machine(spark)
    spark.stop()

    pipelines: dict[str, Any] = {"status": "skipped"}
    if profile.spark_pipelines:
        import spark_pipelines  # only the quick and full runs start spark-pipelines

        data = args.work / "data" / f"n{headline.target_rows}-b{headline.batch_rows}"
        pipelines = spark_pipelines.run(
            [data / "snapshot", *sorted(data.glob("batch-*"))[: headline.batches]],
            args.work / "spark-pipelines",
            schema=headline.ddl,
        )

    summary = summarize(profile, head, scaling, hist)
    summary["partial_vs_full"] = partial
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
        "history_workload": history_w.describe() if history_w else None,
        "history": hist,
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
