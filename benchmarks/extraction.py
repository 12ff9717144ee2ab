"""Extraction through JDBC: one table read whole in one run, by one partition against four.

    python benchmarks/extraction.py                  # 1M rows, 3 rounds each
    python benchmarks/extraction.py --rows 100000 --rounds 2

The table is a SQLite file (written once with Python's sqlite3): the same JDBC read path as
any database, without a server's own cost in the figure. Each round is a fresh flow's first
run of a WATERMARK source (so it reads every row), with an ``apply`` that counts the rows
it is given, and the run's partitions: 1, or ``num_partitions=4`` on ``id``. Prints JSON:
per partition count, the median seconds and rows per second, and the Python driver's peak
resident memory (the rows never pass through it).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import autocdc
from autocdc.pipelines.execute.extraction import Step
from autocdc.sources.extract import Extraction, ExtractionOptions


def write_table(path: Path, rows: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, "
            "price NUMERIC, updated_at TEXT)"
        )
        conn.executemany(
            "INSERT INTO items VALUES (?, ?, ?, ?, ?)",
            (
                (i, f"item {i}", i % 97, i % 1000 + 0.25, f"2026-01-01 {i % 24:02d}:00:00")
                for i in range(rows)
            ),
        )


def one_run(spark, url: str, partitions: int, root: Path) -> tuple[float, int]:
    shutil.rmtree(root, ignore_errors=True)
    split = {"partition_column": "id", "num_partitions": partitions} if partitions > 1 else {}
    source = Extraction(name="items", url=url, table="items", cdc_order=["updated_at"], **split)
    step = Step(source, "f", "f", root / "checkpoints", root / "storage", "bench")
    start = time.perf_counter()
    done = step.run(spark, ExtractionOptions(), lambda df, _: df.count())
    return time.perf_counter() - start, done.result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autocdc-bench-extract-") as scratch:
        folder = Path(scratch)
        write_table(folder / "shop.db", args.rows)
        url = f"jdbc:sqlite:{folder / 'shop.db'}"
        spark = autocdc.spark_session(folder / "warehouse")
        one_run(spark, url, 1, folder / "warm")  # class loading and the first job
        results = {}
        for partitions in (1, 4):
            times = []
            for _ in range(args.rounds):
                seconds, count = one_run(spark, url, partitions, folder / "run")
                assert count == args.rows, (count, args.rows)
                times.append(seconds)
            median = statistics.median(times)
            results[str(partitions)] = {
                "seconds": [round(t, 2) for t in times],
                "median_s": round(median, 2),
                "rows_per_s": round(args.rows / median),
            }
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results["python_driver_peak_rss_mib"] = round(peak_mib)
        results["speedup_4_vs_1"] = round(results["1"]["median_s"] / results["4"]["median_s"], 2)
        results["rows"] = args.rows
        print(json.dumps(results, indent=2))
        spark.stop()


if __name__ == "__main__":
    main()
