"""What one batch cost: wall seconds, Spark jobs, Delta commits, files and bytes written,
peak JVM heap, and for autocdc the seconds of each step of the batch (its metrics' ``steps``).

Files are counted on disk (data, deletion vectors, Delta log), so every system is
measured the same way whatever it writes. Heap: the driver JVM's heap pools are reset
before the batch and their peaks summed after it; with a lazy collector that is an upper
bound of what the batch needed, comparable between batches of one run. Jobs: the ids the
status tracker knows after the batch and not before (fixed overhead shows up as jobs).
Commits: the Delta log entries (``_delta_log/<version>.json``) the batch added, over all
of the system's tables.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

_COMMIT = re.compile(r"\d{20}\.json")


def _files(dirs: Iterable[Path]) -> dict[Path, int]:
    return {p: p.stat().st_size for d in dirs if d.exists() for p in d.rglob("*") if p.is_file()}


class _Heap:
    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._system = jvm.java.lang.System
        pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
        self._pools = [p for p in pools if p.getType().toString() == "Heap memory"]

    def reset(self) -> None:
        self._system.gc()
        for pool in self._pools:
            pool.resetPeakUsage()

    def peak_mb(self) -> float:
        return sum(p.getPeakUsage().getUsed() for p in self._pools) / 2**20


def _job_ids(spark: SparkSession) -> set[int]:
    """Every job Spark has started (none of ours runs in a job group). The status store
    learns of jobs through the asynchronous listener bus, so drain that first."""
    sc = spark.sparkContext
    sc._jsc.sc().listenerBus().waitUntilEmpty()
    return set(sc.statusTracker().getJobIdsForGroup())


@dataclass(frozen=True)
class BatchCost:
    seconds: float
    jobs: int
    commits: int
    files: int
    bytes: int
    heap_peak_mb: float
    steps: dict[str, float] = field(default_factory=dict)


def measure(spark: SparkSession, dirs: list[Path], step: Callable[[], object]) -> BatchCost:
    heap = _Heap(spark)
    before = _files(dirs)
    heap.reset()
    jobs_before = _job_ids(spark)
    started = time.perf_counter()
    done = step()
    seconds = time.perf_counter() - started
    jobs = len(_job_ids(spark) - jobs_before)
    added = {p: s for p, s in _files(dirs).items() if p not in before}
    commits = sum(1 for p in added if p.parent.name == "_delta_log" and _COMMIT.fullmatch(p.name))
    return BatchCost(
        round(seconds, 3),
        jobs,
        commits,
        len(added),
        sum(added.values()),
        round(heap.peak_mb(), 1),
        getattr(done, "steps", {}),
    )


def summarize(costs: list[BatchCost], rows: int) -> dict[str, float]:
    """Medians over the measured batches."""
    seconds = statistics.median(c.seconds for c in costs)
    return {
        "median_s": round(seconds, 3),
        "rows_per_s": round(rows / seconds),
        "jobs_per_batch": statistics.median(c.jobs for c in costs),
        "commits_per_batch": statistics.mean(c.commits for c in costs),
        "files_per_batch": statistics.median(c.files for c in costs),
        "bytes_per_batch": statistics.median(c.bytes for c in costs),
        "heap_peak_mb": max(c.heap_peak_mb for c in costs),
        "batches": len(costs),
        "steps_s": {
            step: round(statistics.median(c.steps.get(step, 0.0) for c in costs), 3)
            for step in dict.fromkeys(step for c in costs for step in c.steps)
        },
    }
