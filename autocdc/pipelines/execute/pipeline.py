"""One run of a pipeline, the outline the CLI, ``dp.run`` and spark-submit share:
load -> resolve -> run (or apply, or nothing: a dry run), each step a function of its own
that returns a typed result.

The steps run in the project's context, which :func:`in_project` sets and gives back: its
folder is the working folder of Python and of the JVM's file system (relative paths in
the definitions are the project's), the spec's database the current one (unqualified
names in queries find the pipeline's tables), the SQL files' ``SET`` values are set for
the run. Afterwards the session is as it was found: its conf, current database and
working folders.

The outline owns Ctrl-C (:func:`interrupt.noted`): the signal stops the session's work
and ends the run at its next safe point with KeyboardInterrupt (the CLI: one line, exit
130), wherever it lands.

A step that fails on an error that is not autocdc's (Spark's, the user's code) raises
:class:`PipelineStepError`, which names the step and keeps the error as its cause; an
autocdc error, which already says what to do, is raised as it is.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pyspark.sql import SparkSession

from autocdc.engine import session_conf
from autocdc.pipelines.declare import registry
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.errors import PipelineStepError
from autocdc.pipelines.execute import graph, interrupt, runner
from autocdc.runtime import AutoCdcError

Step = Literal["load", "resolve", "run", "apply"]
Result = TypeVar("Result")


@dataclass(frozen=True)
class Loaded:
    """The project's definitions, as declared."""

    project: Project
    registry: registry.Registry


@dataclass(frozen=True)
class Resolved:
    """The definitions checked and ordered, each running flow built (the graph keeps it)."""

    project: Project
    graph: graph.Graph

    @property
    def datasets(self) -> list[str]:
        return [d.name for d in self.graph.order]


@dataclass(frozen=True)
class Ran:
    """A run's end: the datasets in the order they ran, and the runner that ran them."""

    resolved: Resolved
    runner: runner.Runner

    @property
    def datasets(self) -> list[str]:
        return self.resolved.datasets


def _local_fs(spark: SparkSession) -> tuple[Any, Any]:  # py4j objects
    context = spark.sparkContext
    hadoop = context._jvm.org.apache.hadoop  # type: ignore[union-attr]
    return hadoop, hadoop.fs.FileSystem.getLocal(context._jsc.hadoopConfiguration())


def work_in(spark: SparkSession, folder: str | Path) -> None:
    """Make ``folder`` the working directory of the JVM's local file system, against which
    Spark qualifies a relative path such as ``.json("data/changes")``. It is the folder
    the JVM started in otherwise: not the project's under spark-submit or in a notebook."""
    hadoop, local = _local_fs(spark)
    local.setWorkingDirectory(hadoop.fs.Path(str(folder)))


def working_folder(spark: SparkSession) -> str:
    """The JVM's local file system's working directory (see :func:`work_in`)."""
    return str(_local_fs(spark)[1].getWorkingDirectory().toUri().getPath())


@contextlib.contextmanager
def in_project(spark: SparkSession, project: Project) -> Iterator[None]:
    """The project's context while the block runs (see the module docstring), the
    session's and the process's own given back after, however the block ends."""
    database, folder, cwd = spark.catalog.currentDatabase(), working_folder(spark), Path.cwd()
    try:
        os.chdir(project.root)
        work_in(spark, project.root)
        if project.database:
            spark.sql(f"CREATE DATABASE IF NOT EXISTS {project.database}")
            spark.catalog.setCurrentDatabase(project.database)
        yield
    finally:
        os.chdir(cwd)
        work_in(spark, folder)
        spark.catalog.setCurrentDatabase(database)


def _step(step: Step, project: Project, do: Callable[[], Result]) -> Result:
    """``do()``, a failure that is not autocdc's raised as :class:`PipelineStepError`."""
    try:
        return do()
    except AutoCdcError:
        raise
    except Exception as error:
        said = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise PipelineStepError(
            pipeline=project.name, step=step, error=f"{type(error).__name__}: {said}"
        ) from error


def load(project: Project, spark: SparkSession) -> Loaded:
    """Every definition of the project's library files."""
    return Loaded(project, _step("load", project, lambda: registry.load(project, spark)))


def resolve(loaded: Loaded, spark: SparkSession, options: runner.Options) -> Resolved:
    """Every flow checked (what ``options`` fully refreshes as new) and the datasets
    ordered; the running flows built, once."""
    qualify, fresh = runner.qualifier(loaded.project.database), options.resets
    with session_conf(spark, loaded.registry.conf):
        built = _step(
            "resolve",
            loaded.project,
            lambda: graph.resolve(loaded.registry, spark, qualify, fresh),
        )
    return Resolved(loaded.project, built)


def run(resolved: Resolved, spark: SparkSession, options: runner.Options, conf: dict) -> Ran:
    """Every dataset in dependency order (until stopped, ``options.continuous``)."""
    ran = runner.Runner(spark, resolved.project, resolved.graph)
    with session_conf(spark, conf):
        _step("run", resolved.project, lambda: ran.run(options))
    return Ran(resolved, ran)


def apply(resolved: Resolved, spark: SparkSession, datasets: set[str], conf: dict) -> None:
    """``autocdc apply``: what the flows with ``max_staleness`` into ``datasets`` (none:
    every dataset) staged, applied now."""
    ran = runner.Runner(spark, resolved.project, resolved.graph)
    with session_conf(spark, conf):
        _step("apply", resolved.project, lambda: ran.apply_all(datasets))


Command = Literal["run", "dry-run", "apply"]


def execute(
    spark: SparkSession,
    project: Project,
    options: runner.Options,
    command: Command = "run",
    datasets: set[str] | None = None,
    on_resolved: Callable[[Resolved], None] | None = None,
) -> Resolved | Ran:
    """The outline: load -> resolve -> run (``command``), in the project's context
    (:func:`in_project`), Ctrl-C noted (:func:`interrupt.noted`). ``on_resolved`` is
    told the resolved pipeline before it runs; ``datasets``: what ``apply`` applies."""
    with interrupt.noted(spark), in_project(spark, project):
        loaded = load(project, spark)
        resolved = resolve(loaded, spark, options)
        if on_resolved is not None:
            on_resolved(resolved)
        if command == "dry-run":
            return resolved
        if command == "apply":
            apply(resolved, spark, datasets or set(), loaded.registry.conf)
            return resolved
        return run(resolved, spark, options, loaded.registry.conf)
