"""``autocdc query SQL``: a query over the pipeline's tables with fresh reads, for pipeline
users (no flow re-declared in Python): ``<table>__autocdc_current`` views of every AUTO
CDC target, and with ``--fresh`` each such table's own name reading it with its staged
changes merged in (:mod:`autocdc.pipelines.operations.fresh`). The query runs in the
project's database, so its tables need no qualifier."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table

from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.execute import pipeline
from autocdc.pipelines.operations import fresh


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", help='e.g. "SELECT * FROM customers__autocdc_current"')
    parser.add_argument("--spec", type=Path, help="spark-pipeline.yml (default: found)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="each AUTO CDC table's own name reads it with its staged changes merged in",
    )
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="default: 100")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")


def main_query(args: argparse.Namespace, project: Project, spark: SparkSession) -> int:
    """Print the first ``--limit`` rows of the query (a table, or JSON lines)."""
    fresh.register(spark, fresh.resolve(spark, project), args.fresh)
    with pipeline.in_project(spark, project):
        df = spark.sql(args.sql)
        rows = df.limit(args.limit + 1).collect()
    shown, more = rows[: args.limit], len(rows) > args.limit
    if args.json:
        for row in shown:
            print(json.dumps(row.asDict(recursive=True), default=str))
    else:
        table = Table(*df.columns, box=None)
        for row in shown:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        Console(width=None if sys.stdout.isatty() else 160).print(table)
        said = f"first {args.limit} rows" if more else f"{len(shown)} rows"
        print(f"autocdc: {said}", file=sys.stderr)
    return 0
