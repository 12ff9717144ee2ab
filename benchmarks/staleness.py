"""Merge-on-read within ``max_staleness``: staged micro-batches against a MERGE per batch.

Small micro-batches (100 changes each, the workload's mix of inserts, updates, deletes,
late changes and duplicates) into a target of ``--rows`` rows, for SCD type 1 and 2:

* a staged micro-batch (``AutoCdcFlow.stage``: validate, quarantine, append) against the
  floor's MERGE of the same batch (SCD2: the hand-written SCD2 MERGE), batch by batch;
* the writer's total: staging every batch and applying the staged ones every
  ``--apply-every`` batches, against the floor MERGEing every batch;
* a read of ``flow.current(spark)`` with ``--apply-every`` batches staged against a plain
  read of the target's current rows (both a full scan: every row hashed);
* exactness: each fresh read equals the target once the staged batches are applied.

    python benchmarks/staleness.py                       # 1M rows, 20 batches, SCD1 and 2
    python benchmarks/staleness.py --rows 100000 --batches 10 --scd 1

Prints the medians and ratios; not a timed test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ab import flow
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from systems import Floor, HandScd2
from workload import Workload, write

import autocdc


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    done = step()
    return time.perf_counter() - started, done


def scan(df: DataFrame) -> int:
    """A full read of ``df``: every column of every row hashed, the hashes xor-ed."""
    return df.select(F.bit_xor(F.xxhash64(*df.columns))).first()[0]


def same_rows(a: DataFrame, b: DataFrame) -> bool:
    return a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(
    spark: SparkSession, scd_type: int, load: Path, batches: list[Path], every: int, work: Path
) -> None:
    floor = (Floor if scd_type == 1 else HandScd2)(work / "warehouse", f"floor_scd{scd_type}")
    target = f"stale_scd{scd_type}"
    floor.load(spark.read.parquet(str(load)))
    flow(autocdc, target, scd_type).apply(spark.read.parquet(str(load)))  # the initial load
    # Applied every `every` batches, not by its age.
    staging = flow(autocdc, target, scd_type, max_staleness="1 day")
    floor_s, stage_s, apply_s, fresh_s, plain_s = [], [], [], [], []
    exact = []
    for i, path in enumerate(batches, start=1):
        seconds, _ = timed(lambda p=path: floor.apply(spark.read.parquet(str(p))))
        floor_s.append(seconds)
        seconds, metrics = timed(lambda p=path: staging.stage(spark.read.parquet(str(p))))
        stage_s.append(seconds)
        print(
            f"scd{scd_type} batch {i}: floor MERGE {floor_s[-1]:.2f} s, staged "
            f"{stage_s[-1]:.2f} s ({metrics.staged_rows} rows staged) "
            f"[{' '.join(f'{k} {v:.2f}' for k, v in metrics.steps.items())}]",
            flush=True,
        )
        if i % every:
            continue
        plain, _ = timed(lambda: scan(flow(autocdc, target, scd_type).current(spark)))
        fresh_df: DataFrame | None = None

        def fresh() -> int:
            nonlocal fresh_df
            fresh_df = staging.current(spark)
            return scan(fresh_df)

        seconds, _ = timed(fresh)
        plain_s.append(plain)
        fresh_s.append(seconds)
        seconds, applied = timed(lambda: staging.apply_staged(spark))
        apply_s.append(seconds)
        exact.append(same_rows(fresh_df, flow(autocdc, target, scd_type).current(spark)))
        print(
            f"scd{scd_type} after batch {i}: plain read {plain:.2f} s, current() with "
            f"{every} staged {fresh_s[-1]:.2f} s; apply of {applied.applied_staged} staged "
            f"rows {apply_s[-1]:.2f} s; fresh read exact: {exact[-1]}",
            flush=True,
        )
    writer = sum(stage_s) + sum(apply_s)
    print(
        f"scd{scd_type} summary over {len(batches)} batches of 100 changes:\n"
        f"  staged micro-batch median {median(stage_s):.2f} s; floor MERGE median "
        f"{median(floor_s):.2f} s; ratio {median(stage_s) / median(floor_s):.2f}x\n"
        f"  writer total (stage all, apply every {every}) {writer:.1f} s; floor MERGE every "
        f"batch {sum(floor_s):.1f} s; ratio {writer / sum(floor_s):.2f}x "
        f"(apply median {median(apply_s):.2f} s)\n"
        f"  current() with {every} staged median {median(fresh_s):.2f} s; plain read median "
        f"{median(plain_s):.2f} s; difference {median(fresh_s) - median(plain_s):+.2f} s\n"
        f"  fresh reads exact: {all(exact)} ({len(exact)} reads)",
        flush=True,
    )
    if not all(exact):
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--apply-every", type=int, default=10)
    parser.add_argument("--scd", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work", type=Path, default=Path("/tmp/autocdc-staleness"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    w = Workload(args.rows, 100, args.batches)
    load, batches = write(spark, w, args.work / "data")
    for scd_type in args.scd:
        run(spark, scd_type, load, batches, args.apply_every, args.work)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
