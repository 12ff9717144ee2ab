"""Fresh reads for pipeline users: a target with what its flow holds staged merged in,
from the project's own definitions (Python or SQL), with nothing re-declared.

A flow with ``max_staleness`` applies its staged changes at most that late; until then
readers of the table see it as of the last apply. :func:`current` and the views of
:func:`register` merge the staged changes in at read time, as ``AutoCdcFlow.current``
does for the engine's users: the project is resolved as a dry run does (nothing is
written), and each AUTO CDC dataset's running flow answers.

* ``<table>__autocdc_current``: the live rows (SCD type 2: each key's open version,
  without the validity columns), for every AUTO CDC target;
* with ``fresh``, a view named as the dataset itself, shadowing its table for unqualified
  names: the whole table (SCD type 2: every version) as it will be once the staged
  changes are applied. ``autocdc query --fresh "SELECT ... FROM customers"`` reads it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from autocdc.engine import CURRENT_VIEW_SUFFIX, AutoCdcFlow, table_exists
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.errors import (
    FreshReadAmbiguousError,
    NoSuchDatasetError,
    TargetNotCreatedError,
)
from autocdc.pipelines.execute import pipeline, runner
from autocdc.pipelines.execute.kinds import change_kinds


def resolve(spark: SparkSession, project: Project) -> pipeline.Resolved:
    """The project's definitions, checked and ordered as a dry run does (nothing written)."""
    resolved = pipeline.execute(spark, project, runner.Options(), command="dry-run")
    assert isinstance(resolved, pipeline.Resolved)
    return resolved


def engine(resolved: pipeline.Resolved, dataset: str) -> AutoCdcFlow | None:
    """The running flow that answers for ``dataset``'s fresh rows: its one flow that
    stages, else its first AUTO CDC flow; None: not an AUTO CDC target."""
    known = [d.name for d in resolved.graph.order if d.kind != "temporary_view"]
    if dataset not in known:
        pipeline_name = resolved.project.name
        raise NoSuchDatasetError(pipeline=pipeline_name, name=dataset, known=", ".join(known))
    changes = change_kinds(resolved.graph.of(dataset))
    staging = [k for k in changes if k.stages]
    if len(staging) > 1:
        flows = ", ".join(k.name for k in staging)
        raise FreshReadAmbiguousError(dataset=dataset, flows=flows)
    chosen = staging or changes
    return chosen[0].engine if chosen else None


def current(spark: SparkSession, resolved: pipeline.Resolved, dataset: str) -> DataFrame:
    """``dataset``'s live rows now: an AUTO CDC target's with its staged changes merged
    in (SCD type 2: each key's open version); any other dataset's table as it is."""
    flow = engine(resolved, dataset)
    qualified = runner.qualifier(resolved.project.database)(dataset)
    if flow is None:
        return spark.table(qualified)
    if not table_exists(spark, flow.target):
        raise TargetNotCreatedError(dataset=dataset, pipeline=resolved.project.name)
    return flow.current(spark)


def register(spark: SparkSession, resolved: pipeline.Resolved, fresh: bool = False) -> list[str]:
    """Register ``<table>__autocdc_current`` for every AUTO CDC target that exists (and,
    ``fresh``, a view of each such dataset's own unqualified name: the whole table with
    its staged changes merged in); the views' names. They show the rows as of this call."""
    views = []
    for dataset in resolved.graph.order:
        flow = None if dataset.kind == "temporary_view" else engine(resolved, dataset.name)
        if flow is None or not table_exists(spark, flow.target):
            continue
        name = dataset.name.rpartition(".")[2] + CURRENT_VIEW_SUFFIX
        views.append(flow.current_view(spark, name))
        if fresh and "." not in dataset.name:
            flow.fresh(spark).createOrReplaceTempView(dataset.name)
            views.append(dataset.name)
    return views
