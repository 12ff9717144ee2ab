"""Resolve a pipeline's datasets into dependency order, checking every flow before any run.

A dataset depends on what its flows read. The reads are recorded while each query is
built (``spark.table``, ``read.table``, ``readStream.table``, and the relations of every
SQL text), and a read of a dataset that has no table yet fails to analyze: that flow
waits, and is tried again once the dataset it read has a *placeholder*, a temporary view
of the same name and schema (dropped again at the end). No progress with flows still
waiting means a cycle.
"""

from __future__ import annotations

import contextlib
import graphlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.readwriter import DataFrameReader
from pyspark.sql.streaming.readwriter import DataStreamReader

from autocdc.engine import (
    DefinitionChangedError,
    MaxStalenessUnsupportedError,
    SnapshotSequenceError,
    TargetNotPartialError,
)
from autocdc.pipelines.declare.registry import (
    CdcFlow,
    Dataset,
    Flow,
    Registry,
    SnapshotFlow,
)
from autocdc.pipelines.errors import (
    CycleError,
    DatasetNotFoundError,
    FlowAnalysisError,
    FlowsDisagreeError,
    NotAStreamingTableError,
    PipelineDefinitionError,
    SnapshotTargetSharedError,
    UndefinedTargetError,
)
from autocdc.pipelines.execute.kinds import (
    Kind,
    change_flow,
    change_flows,
    check_clock,
    is_query,
    place,
    snapshot_flow,
)
from autocdc.runtime import AutoCdcError

_RELATION = re.compile(r"'UnresolvedRelation \[(.*?)\], \[")


@dataclass
class Graph:
    """The datasets in dependency order, each with its flows and the datasets it reads;
    ``kinds``: what a run does with each flow (by flow name), its running engine built
    once (:func:`kinds.place`)."""

    order: list[Dataset]
    flows: dict[str, list[Flow]]
    reads: dict[str, set[str]] = field(default_factory=dict)
    kinds: dict[str, Kind] = field(default_factory=dict)

    def of(self, dataset: str) -> list[Kind]:
        """The kinds of the flows into ``dataset``, in declaration order."""
        return [self.kinds[f.name] for f in self.flows[dataset]]


def _last(name: str) -> str:
    return name.replace("`", "").split(".")[-1].lower()


@contextlib.contextmanager
def recording_reads(spark: SparkSession) -> Iterator[set[str]]:
    """Record the names every table read and SQL text refers to while in the block."""
    names: set[str] = set()
    parser = spark._jsparkSession.sessionState().sqlParser()
    originals = {
        (SparkSession, "table"): SparkSession.table,
        (DataFrameReader, "table"): DataFrameReader.table,
        (DataStreamReader, "table"): DataStreamReader.table,
        (SparkSession, "sql"): SparkSession.sql,
    }

    def reading(cls: type, attr: str):
        original = originals[(cls, attr)]

        def wrapper(self, text, *args, **kwargs):
            if attr == "sql":
                with contextlib.suppress(Exception):
                    plan = parser.parsePlan(text).toString()
                    names.update(_last(m.split(", ")[-1]) for m in _RELATION.findall(plan))
            else:
                names.add(_last(text))
            return original(self, text, *args, **kwargs)

        return wrapper

    for cls, attr in originals:
        setattr(cls, attr, reading(cls, attr))
    try:
        yield names
    finally:
        for (cls, attr), original in originals.items():
            setattr(cls, attr, original)


def check_targets(registry: Registry) -> dict[str, list[Flow]]:
    """Every flow's target, per dataset, checked: it exists and takes the flow, and the
    AUTO CDC flows into it agree (and can go on the clock of a snapshot flow into it)."""
    flows: dict[str, list[Flow]] = {name: [] for name in registry.datasets}
    for flow in registry.flows.values():
        dataset = registry.datasets.get(flow.target)
        if dataset is None:
            raise UndefinedTargetError(where=flow.where, flow=flow.name, target=flow.target)
        own_query = is_query(flow) and flow.name == dataset.name
        if dataset.kind != "streaming_table" and not own_query:
            raise NotAStreamingTableError(
                where=flow.where,
                flow=flow.name,
                target=flow.target,
                kind=dataset.kind.replace("_", " "),
                what="Append flows" if is_query(flow) else "AUTO CDC flows",
            )
        cdc = change_flow(flow)
        if cdc is not None and cdc.definition.max_staleness is not None:
            _check_staging(cdc)
        flows[dataset.name].append(flow)
    for into in flows.values():
        _check_alone(into)
        changes = change_flows(into)
        _check_agree(changes)
        _check_partial_staging(changes)
        _check_on_clock(into)
    return flows


def _check_staging(flow: CdcFlow) -> None:
    """A flow with ``max_staleness`` stages its micro-batches and applies them later as
    one batch: an extraction flow orders its changes by each run's read, which a later
    apply cannot tell apart, and a once flow is a single batch anyway."""
    why = None
    if flow.extraction is not None:
        why = "it reads an extraction source (its changes are ordered by each run's read)"
    elif flow.once:
        why = "it is a once flow (one batch, applied as it is read)"
    if why is not None:
        raise PipelineDefinitionError(
            where=flow.where,
            problem=f"flow `{flow.name}` sets max_staleness, but {why}",
            hint="Remove max_staleness from this flow.",
        )


def _check_partial_staging(flows: list[CdcFlow]) -> None:
    """A flow with ``max_staleness`` applies its staged batches as one, exact for
    full-row upserts only: it cannot write into a target another flow updates partially
    (which makes the target partial, :func:`place`)."""
    if not any(f.definition.partial for f in flows):
        return
    for flow in flows:
        if flow.definition.max_staleness is not None and not flow.definition.partial:
            raise MaxStalenessUnsupportedError(
                flow=flow.definition.flow_name, why="`partial_target` (partial upserts)"
            )


def _check_alone(flows: list[Flow]) -> None:
    """A snapshot flow deletes every key its snapshot lacks: it shares a target only with
    change flows, and only when it places its snapshots on their clock (``sequence_by``)."""
    snapshot = snapshot_flow(flows)
    if snapshot is None or len(flows) == 1:
        return
    others = [f for f in flows if f is not snapshot]
    alone = snapshot.definition.sequence_by is None
    if alone or len(change_flows(others)) < len(others):
        other = next(f for f in others if alone or change_flow(f) is None)
        raise SnapshotTargetSharedError(
            where=snapshot.where,
            flow=snapshot.name,
            target=snapshot.target,
            other=other.name,
            first=other.where,
        )


def _check_agree(flows: list[CdcFlow]) -> None:
    """The flows into one target declare alike what they share through its state
    (:meth:`FlowDefinition.shared`)."""
    first = flows[0].definition.shared() if flows else {}
    for flow in flows[1:]:
        for name, value in flow.definition.shared().items():
            other = first[name]
            if value != other:
                raise FlowsDisagreeError(
                    where=flow.where,
                    flow=flow.name,
                    target=flow.target,
                    field=name,
                    value=value,
                    other=flows[0].name,
                    first=flows[0].where,
                    other_value=other,
                )


def _check_on_clock(flows: list[Flow]) -> None:
    """The change flows into a target a snapshot flow shares go on its clock
    (:func:`place`): each must be able to (:meth:`FlowDefinition.check_snapshot_target`)."""
    if snapshot_flow(flows) is not None:
        for flow in change_flows(flows):
            flow.definition.check_snapshot_target()


def _not_found(error: AnalysisException) -> str | None:
    if error.getCondition() != "TABLE_OR_VIEW_NOT_FOUND":
        return None
    return _last(error.getMessageParameters().get("relationName", ""))


def resolve(
    registry: Registry,
    spark: SparkSession,
    qualify: Callable[[str], str],
    fresh: Callable[[str], bool] = lambda name: False,
) -> Graph:
    """Check every flow and order the datasets; raise the first problem found. Datasets
    for which ``fresh`` holds are checked as new (a full refresh will drop them)."""
    flows = check_targets(registry)
    kinds = place(registry, flows, qualify)
    names = {_last(n): n for n in registry.datasets}
    waiting = dict(registry.datasets)
    reads: dict[str, set[str]] = {}
    blocked: dict[str, tuple[str, Flow]] = {}
    placeholders: list[str] = []
    try:
        while waiting:
            progress = False
            for name in list(waiting):
                try:
                    with recording_reads(spark) as read:
                        built = [(kinds[f.name], fresh(name)) for f in flows[name]]
                        frames = [(k, k.build(spark, new)) for k, new in built]
                        check_clock(frames)
                except AnalysisException as error:
                    missing = _not_found(error)
                    current = flows[name][0]
                    if missing in names and names[missing] in waiting and missing != _last(name):
                        blocked[name] = (names[missing], current)
                        continue
                    if missing is not None:
                        raise DatasetNotFoundError(
                            where=current.where, flow=current.name, name=missing
                        ) from error
                    # the message without the analyzed plan (that goes to the log file)
                    problem = error.getMessage() or str(error)
                    raise FlowAnalysisError(
                        where=current.where, flow=current.name, problem=problem
                    ) from error
                except SnapshotSequenceError as error:  # its class, as the docs promise
                    snapshot = snapshot_flow(flows[name])
                    assert snapshot is not None
                    raise _on_the_pipelines_clock(error, snapshot, name) from error
                except AutoCdcError as error:
                    if error.error_class.startswith("AUTOCDC_PIPELINE"):
                        raise
                    cdc = [f for f in flows[name] if kinds[f.name].applies_changes]
                    named = [f for f in flows[name] if f.name == error.params.get("flow")]
                    current = (named or cdc or flows[name])[0]
                    located = _in_pipeline(error, name).located(current.where, current.name)
                    raise located from error
                reads[name] = {names[r] for r in read if r in names and names[r] != name}
                if any(df is not None for _, df in frames) and "." not in name:
                    kind, df = next((k, df) for k, df in frames if df is not None)
                    kind.placeholder(df).createOrReplaceTempView(name)
                    placeholders.append(name)
                del waiting[name]
                blocked.pop(name, None)
                progress = True
            if not progress:
                raise _cycle(blocked)
    finally:
        for name in placeholders:
            spark.catalog.dropTempView(name)
    try:
        order = list(graphlib.TopologicalSorter(reads).static_order())
    except graphlib.CycleError as error:
        cycle = error.args[1]
        where = registry.datasets[cycle[0]].where
        raise CycleError(cycle=" -> ".join(cycle), where=where) from None
    return Graph([registry.datasets[n] for n in order], flows, reads, kinds)


def _cycle(blocked: dict[str, tuple[str, Flow]]) -> CycleError:
    """Follow the waits from any blocked dataset until one repeats."""
    start = next(iter(blocked))
    path = [start]
    while blocked[path[-1]][0] not in path:
        path.append(blocked[path[-1]][0])
    cycle = [*path[path.index(blocked[path[-1]][0]) :], blocked[path[-1]][0]]
    return CycleError(cycle=" -> ".join(cycle), where=blocked[cycle[0]][1].where)


def _on_the_pipelines_clock(
    error: SnapshotSequenceError, snapshot: SnapshotFlow, dataset: str
) -> SnapshotSequenceError:
    """``error`` with the remedy a pipeline's user takes: the run puts the change flows on
    the shared clock itself, so what is left is the snapshot flow's position, where it is
    declared, or a target built before without it."""
    remedy = (
        f"Make the position of `{snapshot.name}` ({snapshot.where}: `sequence_by`, SQL "
        "`SEQUENCE BY`) give the change flows' sequence type (CAST it, or "
        "autocdc.hex_sequence for an LSN or a _CHANGE_SEQUENCE_NUMBER); a target built "
        f"without the snapshot flow starts over with `autocdc run --full-refresh {dataset}`."
    )
    return SnapshotSequenceError(**{**error.params, "remedy": remedy})


def _in_pipeline(error: AutoCdcError, dataset: str) -> AutoCdcError:
    """``error`` with the remedy a pipeline's user runs (not a flow object's call)."""
    if isinstance(error, DefinitionChangedError | TargetNotPartialError):
        remedy = (
            f"`autocdc run --full-refresh {dataset}` (`full_refresh={{'{dataset}'}}` in dp.run)"
        )
        return type(error)(**{**error.params, "remedy": remedy})
    return error
