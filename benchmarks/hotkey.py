"""SCD type 2 with hot keys: few keys, many versions of each in one batch.

A busy row of a database (pgbench's branches: every transaction updates one of three)
sends tens of thousands of versions of one key per micro-batch. Each batch here gives
every key ``--versions`` changes in sequence order (most open a version, every 10th
repeats the values, every 50th is a delete, the change after it a reinsert), the next
batch continues where the last ended, and a last batch of a few late changes lands in
the middle of the history. Every target is checked against the reference fold of
tests/support/reference.py.

    python benchmarks/hotkey.py                                   # 1 key x 100k, 3 x 30k
    python benchmarks/hotkey.py --base main --shape 1x20000 --timeout 300

With ``--base REV`` the same batches go to that revision's engine too, in one session,
alternating which goes first (see ab.py); an apply running past ``--timeout`` seconds is
cancelled and that engine's later batches skipped.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from ab import export_engine, flow
from pyspark.sql import DataFrame, SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from reference import DELETE, UPSERT, Change, fold_scd2

import autocdc

SCHEMA = "id long, balance long, note string, op string, seq long"
LATE = 5  # late changes per key in the last batch


def batch_rows(keys: int, versions: int, first: int) -> list[tuple[Any, ...]]:
    """``versions`` changes of each key at sequences ``first``.. (interleaved by key)."""
    rows = []
    for v in range(first, first + versions):
        for k in range(keys):
            seq = v * 10
            if v % 50 == 49:
                rows.append((k, None, None, "D", seq))
            else:
                balance = v - 1 if v % 10 == 9 else v  # every 10th repeats the last values
                rows.append((k, balance, f"n{balance % 7}", "U", seq))
    return rows


def late_rows(keys: int, versions: int) -> list[tuple[Any, ...]]:
    """A few changes per key that fall between logged ones (sequences end in 5)."""
    step = max(1, versions // LATE)
    return [(k, -v, "late", "U", v * 10 + 5) for k in range(keys) for v in range(1, versions, step)]


def as_changes(rows: list[tuple[Any, ...]]) -> list[Change]:
    return [
        Change(k, s, DELETE) if op == "D" else Change(k, s, UPSERT, (b, n))
        for k, b, n, op, s in rows
    ]


def timed_apply(spark: SparkSession, f: Any, df: DataFrame, timeout: float) -> tuple[float, Any]:
    """Seconds and metrics of ``f.apply(df)``; None metrics when it ran past ``timeout``
    (its jobs are cancelled)."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["metrics"] = f.apply(df)
        except Exception as error:  # a cancelled apply ends this way
            done["error"] = error

    started = time.perf_counter()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        spark.sparkContext.cancelAllJobs()
        worker.join(60)
        return time.perf_counter() - started, None
    if "error" in done:
        raise done["error"]
    return time.perf_counter() - started, done["metrics"]


def versions_of(spark: SparkSession, target: str) -> set[tuple[Any, ...]]:
    rows = spark.table(target).collect()
    return {(r.id, (r.balance, r.note), r["__START_AT"], r["__END_AT"]) for r in rows}


def run_shape(
    spark: SparkSession, engines: dict[str, ModuleType], keys: int, versions: int, args: Any
) -> dict[str, list[float | None]]:
    batches = [batch_rows(keys, versions, 1 + i * versions) for i in range(args.batches)]
    if args.late:
        batches.append(late_rows(keys, versions * args.batches))
    name = f"{keys}x{versions}"
    flows = {e: flow(m, f"hot_{e}_{keys}x{versions}", 2) for e, m in engines.items()}
    seconds: dict[str, list[float | None]] = {e: [] for e in engines}
    alive = set(engines)
    for i, rows in enumerate(batches):
        df = spark.createDataFrame(rows, SCHEMA).cache()
        df.count()
        kind = "late" if args.late and i == len(batches) - 1 else f"batch {i + 1}"
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        for e in order:
            if e not in alive:
                seconds[e].append(None)
                continue
            took, metrics = timed_apply(spark, flows[e], df, args.timeout)
            if metrics is None:
                alive.discard(e)
                seconds[e].append(None)
                print(f"{name} {kind:8} {e:4}: > {args.timeout:.0f} s (cancelled)", flush=True)
                continue
            seconds[e].append(took)
            steps = " ".join(f"{k} {v:.2f}" for k, v in metrics.steps.items())
            print(
                f"{name} {kind:8} {e:4}: {took:7.2f} s, {len(rows) / took:9.0f} changes/s "
                f"[{steps}]",
                flush=True,
            )
        df.unpersist()
    expected = fold_scd2(as_changes([r for b in batches for r in b]))
    for e in sorted(alive):
        got = versions_of(spark, flows[e].target)
        verdict = "equals the reference fold" if got == expected else "DIFFERS from the fold"
        print(f"{name} {e}: {len(got)} versions, {verdict}", flush=True)
        if got != expected:
            raise SystemExit(1)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["1x100000", "3x30000"], help="KEYSxN")
    parser.add_argument("--batches", type=int, default=2, help="in-order batches per shape")
    parser.add_argument("--no-late", dest="late", action="store_false", help="no late batch")
    parser.add_argument("--base", help="a git revision to pair with (as ab.py)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per apply")
    parser.add_argument("--work", type=Path, default=Path("/tmp/autocdc-hotkey"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    engines: dict[str, ModuleType] = {"new": autocdc}
    if args.base:
        engines["base"] = export_engine(args.base, Path(tempfile.mkdtemp(prefix="autocdc-hot-")))
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    for shape in args.shape:
        keys, versions = (int(x) for x in shape.split("x"))
        seconds = run_shape(spark, engines, keys, versions, args)
        if args.base:
            pairs = [n / b for n, b in zip(seconds["new"], seconds["base"], strict=True) if n and b]
            if pairs:
                print(f"{shape}: median new/base {statistics.median(pairs):.3f} ({len(pairs)})")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
