"""Paired A/B: this checkout's engine against another revision's, on the same batches.

Full runs of one engine spread widely on a shared machine, so an engine change is judged
by pairs: both engines in one process and one Spark session, each batch applied to both
(in alternating order: A then B, then B then A), the ratio taken batch by batch. The
other revision's ``autocdc`` package is exported from git under another name
(``autocdc_base``), so the two never share a module.

    python benchmarks/ab.py --base HEAD~1                   # 1M rows, 100k-change batches
    python benchmarks/ab.py --base main --rows 100000 --batch 10000 --scd 1

Prints one line per batch (seconds of each, ratio new/base, the new engine's steps) and
the medians; checks that both targets hold the same rows at the end.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from workload import Workload, write

import autocdc

_IMPORT = re.compile(r"^(\s*)(from|import) autocdc\b", re.MULTILINE)


def export_engine(revision: str, into: Path) -> ModuleType:
    """``revision``'s ``autocdc`` package, importable as ``autocdc_base``."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "archive", revision, "autocdc"], cwd=repo, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    package = into / "autocdc_base"
    (into / "autocdc").rename(package)
    for source in package.rglob("*.py"):
        text = source.read_text()
        source.write_text(_IMPORT.sub(r"\1\2 autocdc_base", text))
    sys.path.insert(0, str(into))
    import autocdc_base

    return autocdc_base


def flow(engine: ModuleType, target: str, scd_type: int, **options: Any) -> Any:
    """The benchmarks' flow over their workload's changes (``engine``: autocdc, or another
    revision's package)."""
    return engine.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=scd_type,
        **options,
    )


def timed(step: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    done = step()
    return time.perf_counter() - started, done


def pair(
    spark: Any, scd_type: int, base: ModuleType, load: Path, batches: list[Path], large: int
) -> None:
    """Load both targets and apply each batch to both; ``large``: how many of the
    batches (the first) are the large ones, the rest small."""
    new_flow = flow(autocdc, f"ab_new_scd{scd_type}", scd_type)
    base_flow = flow(base, f"ab_base_scd{scd_type}", scd_type)
    flows = {"new": new_flow, "base": base_flow}
    ratios: dict[str, list[float]] = {}
    for i, path in enumerate([load, *batches]):
        kind = "load" if i == 0 else ("large" if i <= large else "small")
        order = ["new", "base"] if i % 2 == 0 else ["base", "new"]
        seconds: dict[str, float] = {}
        steps: dict[str, str] = {}
        for name in order:
            seconds[name], metrics = timed(
                lambda f=flows[name], p=path: f.apply(spark.read.parquet(str(p)))
            )
            steps[name] = " ".join(f"{k} {v:.2f}" for k, v in metrics.steps.items())
        ratio = seconds["new"] / seconds["base"]
        ratios.setdefault(kind, []).append(ratio)
        print(
            f"scd{scd_type} {kind:5} batch {i}: new {seconds['new']:.2f} s, "
            f"base {seconds['base']:.2f} s, new/base {ratio:.3f}\n"
            f"    new  [{steps['new']}]\n    base [{steps['base']}]",
            flush=True,
        )
    for kind, values in ratios.items():
        if kind != "load":
            print(
                f"scd{scd_type} {kind}: median new/base {statistics.median(values):.3f} "
                f"over {len(values)} batches ({', '.join(f'{v:.2f}' for v in values)})",
                flush=True,
            )
    new_rows, base_rows = spark.table(new_flow.target), spark.table(base_flow.target)
    same = new_rows.exceptAll(base_rows).isEmpty() and base_rows.exceptAll(new_rows).isEmpty()
    print(f"scd{scd_type}: targets {'identical' if same else 'DIFFER'}", flush=True)
    if not same:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=4, help="large batches (rounds)")
    parser.add_argument("--small", type=int, default=4, help="then batches of 100 changes")
    parser.add_argument("--scd", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work", type=Path, default=Path("/tmp/autocdc-ab"))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=INT",
        help="the new engine only: an integer setting of an engine module, e.g. "
        "commit.FOLD_EVERY=4 (to try a value without a commit)",
    )
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    base = export_engine(args.base, Path(tempfile.mkdtemp(prefix="autocdc-ab-")))
    for setting in args.set:
        name, _, value = setting.partition("=")
        module, _, attribute = name.rpartition(".")
        setattr(importlib.import_module(f"autocdc.engine.{module}"), attribute, int(value))
    spark = autocdc.spark_session(warehouse=args.work / "warehouse")
    w = Workload(args.rows, args.batch, args.batches, tail_batches=args.small, tail_rows=100)
    load, batches = write(spark, w, args.work / "data")
    for scd_type in args.scd:
        pair(spark, scd_type, base, load, batches, args.batches)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
