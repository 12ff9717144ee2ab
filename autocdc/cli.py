"""Command line: ``python -m autocdc run PIPELINE_FILE [--warehouse DIR]``.

A pipeline file is a Python file with a ``main(spark)`` function; the CLI builds the
session (local Spark + Delta, tables in the warehouse folder) and calls it.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

from autocdc.engine.errors import AutoCdcError
from autocdc.engine.session import spark_session


class PipelineFileError(Exception):
    """The pipeline file is missing or has no ``main(spark)``."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autocdc", description="Run autocdc pipelines.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a pipeline file's main(spark)")
    run.add_argument("pipeline", type=Path, help="Python file defining main(spark)")
    run.add_argument("--warehouse", default="warehouse", help="table folder (default: warehouse)")
    return parser


def _load_main(path: Path) -> Callable[..., object]:
    """Execute the pipeline file (not as ``__main__``) and return its ``main``."""
    if not path.is_file():
        raise PipelineFileError(f"pipeline file not found: {path}")
    entry = runpy.run_path(str(path)).get("main")
    if not callable(entry):
        raise PipelineFileError(f"{path} defines no main(spark) function")
    return entry


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``autocdc`` script; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        entry = _load_main(args.pipeline)
        entry(spark_session(warehouse=args.warehouse))
    except (AutoCdcError, PipelineFileError) as error:
        print(f"autocdc: {error}", file=sys.stderr)
        return 2
    return 0
