"""Command line: ``autocdc run | dry-run | apply | status | history | query | report |
init | launcher`` (also ``python -m autocdc``).

The flags of ``run`` are those of Spark's ``spark-pipelines`` CLI. A definition problem
exits with status 2 before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import traceback
from datetime import datetime
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pydantic import ValidationError
from rich.console import Console

from autocdc.pipelines.declare import project, scaffold
from autocdc.pipelines.errors import PipelineStepError
from autocdc.pipelines.execute import interrupt, lock, pipeline, replay, rewind, runner
from autocdc.pipelines.operations import overview, query, report
from autocdc.runtime import AutoCdcError, log_file
from autocdc.sources import spark_session
from autocdc.sources.extract import ExtractionOptions


def _names(value: str) -> set[str]:
    return {name.strip() for name in value.split(",") if name.strip()}


def _seconds(interval: str) -> float:
    """``"10 seconds"``, ``10s``, ``1 minute``, ``2m``, ``1h`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)[a-z]*\s*", interval.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{interval!r} is not an interval such as 10s or 1m")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _extract_options(text: str) -> ExtractionOptions:
    """``retries=3,max_concurrency=2,staging=true`` -> the run's extraction options."""
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    try:
        return ExtractionOptions(**{k.strip(): v.strip() for k, _, v in pairs})
    except AutoCdcError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    except ValidationError as error:
        said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise argparse.ArgumentTypeError(said) from None


def _replay_from(text: str) -> replay.Replay:
    """``FLOW=KIND:VALUE`` -> the run's replay."""
    try:
        return replay.parse(text)
    except AutoCdcError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autocdc", description="Run declarative CDC pipelines.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the pipeline: every flow, then exit")
    dry = commands.add_parser("dry-run", help="resolve and check the pipeline, write nothing")
    status = commands.add_parser("status", help="per flow: last batch, rows, quarantine, lag")
    history = commands.add_parser("history", help="per-batch metrics of one flow")
    history.add_argument("flow")
    history.add_argument("--last", type=int, default=20, metavar="N", help="default: 20")
    apply = commands.add_parser(
        "apply", help="apply the changes that flows with max_staleness staged, now"
    )
    apply.add_argument("datasets", nargs="*", help="default: every dataset")
    for command in (run, dry, apply, status, history):
        command.add_argument("--spec", type=Path, help="spark-pipeline.yml (default: found)")
    for command in (status, history):
        command.add_argument("--json", action="store_true", help="stable JSON, for scripts")
    run.add_argument(
        "--full-refresh",
        type=_names,
        default=set(),
        metavar="A,B",
        help="datasets to rebuild: their tables, autocdc state, quarantine and checkpoints "
        "are dropped, then their flows read their sources from the start",
    )
    run.add_argument("--full-refresh-all", action="store_true", help="rebuild every dataset")
    run.add_argument(
        "--refresh",
        type=_names,
        metavar="A,B",
        help="run only these datasets (and those fully refreshed); default: every dataset",
    )
    run.add_argument(
        "--expect-deletes",
        type=_names,
        default=set(),
        metavar="A,B",
        help="datasets whose snapshots may delete beyond max_delete_fraction this run",
    )
    run.add_argument("--continuous", action="store_true", help="keep running until Ctrl-C")
    run.add_argument(
        "--trigger-interval", type=_seconds, default=10.0, help='e.g. "10 seconds", 5s, 1m'
    )
    run.add_argument(
        "--extract-options",
        type=_extract_options,
        metavar="K=V,...",
        help="extraction options for this run, replacing the flows' and sources' "
        "(max_concurrency, retries, staging, page_rows)",
    )
    run.add_argument(
        "--replay-from",
        type=_replay_from,
        metavar="FLOW=KIND:VALUE",
        help="rewind one flow to a position of its source first: version:N or "
        "timestamp:T (a Delta table), offsets:JSON|earliest or timestamp:T (Kafka), "
        "lsn:X/Y (a PostgreSQL capture's change table), "
        'watermark:{"column": value} (a WATERMARK extraction); see docs/operations.md',
    )
    report.add_arguments(commands.add_parser("report", help="write the status page (HTML)"))
    query.add_arguments(commands.add_parser("query", help="SQL over the tables, fresh reads"))
    init = commands.add_parser("init", help="create a sample project")
    init.add_argument("--name", required=True)
    commands.add_parser("launcher", help="print the script to give spark-submit")
    return parser


def _gist(error: BaseException) -> str:
    """``Class: first line of the message``, and for a JVM error the first line of its root
    cause (a failed task wraps what went wrong); the rest is often a query plan or a JVM
    stack trace."""
    if not isinstance(error, Py4JJavaError):
        return f"{type(error).__name__}: {_first_line(str(error))}"
    java = root = error.java_exception  # str(error) begins "An error occurred while calling"
    while root.getCause() is not None:
        root = root.getCause()
    gist = f"{type(error).__name__}: {_first_line(java.toString())}"
    return gist if root.equals(java) else f"{gist}\n  caused by {_first_line(root.toString())}"


def _first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), "")


def _record(error: BaseException) -> Path:
    """Append ``error``'s full traceback to the session's log file; return the file."""
    path = log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{datetime.now():%y/%m/%d %H:%M:%S} ERROR autocdc: the command failed\n")
        traceback.print_exception(error, file=out)
    return path


def _report(args: argparse.Namespace, spec: project.Project) -> int:
    """``status`` / ``history``: JSON (documented keys) or a table; no Spark. A reader
    that stops early (``| head``) ends it quietly, with exit status 141."""
    if args.command == "status":
        doc, show = overview.status(spec), overview.show_status
    else:
        doc, show = overview.history(spec, args.flow, args.last), overview.show_history
    try:
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            show(doc, Console(width=None if sys.stdout.isatty() else 160))  # logs: no wrapping
        sys.stdout.flush()
    except BrokenPipeError:  # the reader had enough (`| head`): as a command SIGPIPE ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and at exit
        return 128 + signal.SIGPIPE
    return 0


def _run(args: argparse.Namespace, spec: project.Project) -> int:
    """``run``, ``dry-run`` and ``apply``: the run's outline (:mod:`pipeline`) in a session
    of the project's; ``status`` and ``history`` read the tables without Spark."""
    if args.command in ("status", "history"):
        return _report(args, spec)
    if getattr(args, "replay_from", None) is not None:  # what can be refused without Spark
        rewind.refuse_early(spec, args.replay_from)
    spark = interrupt.start(lambda: spark_session(spec.warehouse, spec.session_conf))
    if args.command == "query":
        return query.main_query(args, spec, spark)
    options = runner.Options(
        full_refresh=getattr(args, "full_refresh", set()),
        full_refresh_all=getattr(args, "full_refresh_all", False),
        refresh=getattr(args, "refresh", None),
        continuous=getattr(args, "continuous", False),
        trigger_seconds=getattr(args, "trigger_interval", 10.0),
        extract=getattr(args, "extract_options", None),
        expect_deletes=getattr(args, "expect_deletes", set()),
        replay_from=getattr(args, "replay_from", None),
    )

    def announce(resolved: pipeline.Resolved) -> None:
        interrupt.check()
        order = ", ".join(resolved.datasets)
        runner.say(f"pipeline {spec.name}: {len(resolved.datasets)} datasets ({order})")
        if args.command == "dry-run":
            runner.say("dry run: every definition resolved, nothing written")

    datasets = set(getattr(args, "datasets", []) or [])
    pipeline.execute(spark, spec, options, args.command, datasets, announce)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``autocdc`` script; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "init":
            root = scaffold.create(Path(args.name))
            print(f"autocdc: created {root}; run it with: cd {root} && autocdc run")
            return 0
        if args.command == "report":
            return report.main_report(args)
        if args.command == "launcher":
            print(Path(__file__).resolve().parent.parent / "__main__.py")
            return 0
        spec = project.load(args.spec or project.find_spec(Path.cwd()))
        with contextlib.ExitStack() as held:
            if args.command in ("run", "apply"):  # one at a time: refused before Spark starts
                expiry = lock.expiry_seconds(spec)
                held.enter_context(lock.hold(spec.storage_path, spec.name, expiry))
            held.enter_context(interrupt.noted())
            return _run(args, spec)
    except PipelineStepError as error:  # not ours to explain: the cause's gist, logged
        cause = error.__cause__ or error
        print(f"autocdc: {_gist(cause)}\n(details in {_record(error)})", file=sys.stderr)
        return 1
    except AutoCdcError as error:
        print(f"autocdc: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():  # the process is ending:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # no traceback for another Ctrl-C
        print(
            "autocdc: interrupted (Ctrl-C): every committed batch is kept; the next run "
            "goes on from there",
            file=sys.stderr,
        )
        interrupt.release_jvm()  # no JVM left behind once the command has exited
        return 130
    except Exception as error:  # not ours to explain: its gist here, the details logged
        print(f"autocdc: {_gist(error)}\n(details in {_record(error)})", file=sys.stderr)
        return 1
