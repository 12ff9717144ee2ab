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
import dataclasses
import graphlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.readwriter import DataFrameReader
from pyspark.sql.streaming.readwriter import DataStreamReader
from pyspark.sql.types import LongType

from autocdc.engine.errors import AutoCdcError, DefinitionChangedError, TargetNotPartialError
from autocdc.engine.flow import AutoCdcFlow
from autocdc.engine.snapshot import AutoCdcSnapshotFlow
from autocdc.engine.stage import col, sequence_type
from autocdc.pipelines.declare.registry import (
    CdcFlow,
    Dataset,
    Flow,
    QueryFlow,
    Registry,
    SnapshotFlow,
    respec,
)
from autocdc.pipelines.errors import (
    BatchQueryForStreamingTableError,
    CycleError,
    DatasetNotFoundError,
    FlowAnalysisError,
    FlowsDisagreeError,
    NotAStreamingTableError,
    PipelineDefinitionError,
    SnapshotTargetSharedError,
    UndefinedTargetError,
)
from autocdc.pipelines.execute import extraction

_RELATION = re.compile(r"'UnresolvedRelation \[(.*?)\], \[")
CHANGE_TYPE = "_change_type"  # a Delta change data feed's operation column


@dataclass
class Graph:
    """The datasets in dependency order, each with its flows and the datasets it reads."""

    order: list[Dataset]
    flows: dict[str, list[Flow]]
    reads: dict[str, set[str]] = field(default_factory=dict)


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


def source_frame(spark: SparkSession, flow: CdcFlow) -> DataFrame:
    """The change feed of a CDC flow (a once flow's as one batch); a Delta change data
    feed's pre-images are dropped (each update's post-image carries the change). An
    extraction source's has its columns and no rows: the runner reads it
    (:mod:`autocdc.pipelines.execute.extraction`)."""
    if flow.extraction is not None:
        return extraction.frame(spark, flow.extraction)
    reader = spark.readStream if flow.streaming and not flow.once else spark.read
    df = reader.table(flow.source)
    if CHANGE_TYPE in df.columns:
        df = df.where(F.col(CHANGE_TYPE) != "update_preimage")
    return df


def engine_flow(flow: CdcFlow, target: str, read: int = 0) -> AutoCdcFlow:
    """The engine's flow for ``flow`` into ``target`` (qualified by the run), a new one
    each time: an engine flow keeps what it read of its tables between batches. Over an
    extraction source its changes are ordered by ``sequence_by`` and then by the run's
    ``read`` (:func:`extraction.sequence`; 0 when no read is applied: the definition
    checks need only its type)."""
    if flow.extraction is None:
        return respec(flow.spec, target=target)
    by = extraction.sequence(flow.spec.sequence_by, read)
    return respec(flow.spec, target=target, sequence_by=by)


def snapshot_flow(flow: SnapshotFlow, target: str) -> AutoCdcSnapshotFlow:
    return respec(flow.spec, target=target)


def _placeholder(flow: Flow, df: DataFrame) -> DataFrame:
    """What readers of the flow's target see: the query's rows, for a CDC flow the
    selected columns, for a snapshot flow the snapshot's (plus the validity columns of
    type 2, of the sequence's type: a snapshot's version is a bigint)."""
    if isinstance(flow, QueryFlow):
        return df
    if isinstance(flow, SnapshotFlow):  # its position's column is not the target's
        position = flow.spec.sequence_by
        out, seq_type = (df.drop(position) if isinstance(position, str) else df), LongType()
        scd_type = flow.spec.stored_as_scd_type
    else:
        engine = engine_flow(flow, flow.target)  # an extraction flow's sequence: the read's
        listing = engine.columns_to_update_column
        excepted = [*(engine.except_column_list or []), *engine.pseudo_columns, listing]
        keep = engine.column_list or [c for c in df.columns if c not in excepted]
        out = df.select(*[col(c) for c in keep])
        scd_type = engine.stored_as_scd_type
        seq_type = df.select(engine.sequence_column()).schema[0].dataType
    if scd_type == 2:
        validity = [F.lit(None).cast(seq_type).alias(c) for c in ("__START_AT", "__END_AT")]
        out = out.select("*", *validity)
    return out


def check_targets(registry: Registry) -> dict[str, list[Flow]]:
    """Every flow's target, per dataset, checked: it exists and takes the flow, and the
    AUTO CDC flows into it agree; each of those declares the target partial when one is."""
    flows: dict[str, list[Flow]] = {name: [] for name in registry.datasets}
    for flow in registry.flows.values():
        dataset = registry.datasets.get(flow.target)
        if dataset is None:
            raise UndefinedTargetError(where=flow.where, flow=flow.name, target=flow.target)
        own_query = isinstance(flow, QueryFlow) and flow.name == dataset.name
        if dataset.kind != "streaming_table" and not own_query:
            raise NotAStreamingTableError(
                where=flow.where,
                flow=flow.name,
                target=flow.target,
                kind=dataset.kind.replace("_", " "),
                what="Append flows" if isinstance(flow, QueryFlow) else "AUTO CDC flows",
            )
        if isinstance(flow, CdcFlow) and flow.spec.max_staleness is not None:
            _check_staging(flow)
        flows[dataset.name].append(flow)
    for name, into in flows.items():
        _check_alone(into)
        cdc = [f for f in into if isinstance(f, CdcFlow)]
        _check_agree(cdc)
        if any(f.spec.partial for f in cdc):
            flows[name] = into = [_partial(f) if isinstance(f, CdcFlow) else f for f in into]
        if cdc and any(isinstance(f, SnapshotFlow) for f in into):  # one clock for all
            flows[name] = [_on_clock(f) if isinstance(f, CdcFlow) else f for f in into]
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


def _partial(flow: CdcFlow) -> CdcFlow:
    """The flow declaring its target partial: one flow of the target has partial upserts,
    so the target's state, which every flow into it shares, must record which columns
    each upsert set, whichever flow creates it."""
    return dataclasses.replace(flow, spec=respec(flow.spec, partial_target=True))


def _on_clock(flow: CdcFlow) -> CdcFlow:
    """The change flow on the clock it shares with a snapshot flow into its target."""
    return dataclasses.replace(flow, spec=respec(flow.spec, snapshot_target=True))


def _check_alone(flows: list[Flow]) -> None:
    """A snapshot flow deletes every key its snapshot lacks: it shares a target only with
    change flows, and only when it places its snapshots on their clock (``sequence_by``)."""
    snapshot = next((f for f in flows if isinstance(f, SnapshotFlow)), None)
    if snapshot is None or len(flows) == 1:
        return
    others = [f for f in flows if f is not snapshot]
    alone = snapshot.spec.sequence_by is None
    if alone or not all(isinstance(f, CdcFlow) for f in others):
        other = next(f for f in others if alone or not isinstance(f, CdcFlow))
        raise SnapshotTargetSharedError(
            where=snapshot.where,
            flow=snapshot.name,
            target=snapshot.target,
            other=other.name,
            first=other.where,
        )


# What the flows into one target share through its state table (the source, sequence,
# delete condition and column selection are each flow's own), and for SCD type 2 which
# columns open a version (the history is recomputed by whichever flow runs).
_SHARED = (
    "keys",
    "stored_as_scd_type",
    "track_history_column_list",
    "track_history_except_column_list",
    "sequence_groups",
)


def _check_agree(flows: list[CdcFlow]) -> None:
    for flow in flows[1:]:
        for name in _SHARED:
            value, other = (getattr(f.spec, name) for f in (flow, flows[0]))
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


def _check_clock(built: list[tuple[Flow, DataFrame | None]], target: str) -> None:
    """A snapshot flow sharing its target: its position must be of the change flows'
    sequence type, checked before anything runs."""
    frames = [(f, df) for f, df in built if df is not None]
    snapshot = next(((f, df) for f, df in frames if isinstance(f, SnapshotFlow)), None)
    if snapshot is None or snapshot[0].spec.sequence_by is None:
        return
    engine = snapshot_flow(snapshot[0], target)
    for flow, df in frames:
        if isinstance(flow, CdcFlow):
            changes = sequence_type(df, engine_flow(flow, target))
            engine.check_clock(changes, snapshot[1], f"change flow `{flow.name}`'s")


def _not_found(error: AnalysisException) -> str | None:
    if error.getCondition() != "TABLE_OR_VIEW_NOT_FOUND":
        return None
    return _last(error.getMessageParameters().get("relationName", ""))


def build(
    flow: Flow, dataset: Dataset, spark: SparkSession, target: str, fresh: bool = False
) -> DataFrame | None:
    """The DataFrame of one flow (checked by the engine for a CDC or snapshot flow: against
    its stored tables, or as a new target when ``fresh``); for a snapshot flow, its next
    snapshot, None when its function has nothing newer."""
    if isinstance(flow, SnapshotFlow):
        if flow.extraction is not None:  # read by the runner: checked with no rows
            df = extraction.frame(spark, flow.extraction)
            snapshot_flow(flow, target).check(df, fresh)
            return df
        return snapshot_flow(flow, target).peek(spark, flow.source, fresh)
    if isinstance(flow, CdcFlow):
        df = source_frame(spark, flow)
        engine_flow(flow, target).check(df, fresh)
        return df
    df = flow.query()
    if dataset.kind == "streaming_table" and not df.isStreaming:
        raise BatchQueryForStreamingTableError(where=flow.where, flow=flow.name, target=target)
    return df


def resolve(
    registry: Registry,
    spark: SparkSession,
    qualify: Callable[[str], str],
    fresh: Callable[[str], bool] = lambda name: False,
) -> Graph:
    """Check every flow and order the datasets; raise the first problem found. Datasets
    for which ``fresh`` holds are checked as new (a full refresh will drop them)."""
    flows = check_targets(registry)
    names = {_last(n): n for n in registry.datasets}
    waiting = dict(registry.datasets)
    reads: dict[str, set[str]] = {}
    blocked: dict[str, tuple[str, Flow]] = {}
    placeholders: list[str] = []
    try:
        while waiting:
            progress = False
            for name, dataset in list(waiting.items()):
                try:
                    with recording_reads(spark) as read:
                        built = [
                            (f, build(f, dataset, spark, qualify(name), fresh(name)))
                            for f in flows[name]
                        ]
                        frames = [(f, df) for f, df in built if df is not None]
                        _check_clock(built, qualify(name))
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
                except AutoCdcError as error:
                    if error.error_class.startswith("AUTOCDC_PIPELINE"):
                        raise
                    cdc = [f for f in flows[name] if not isinstance(f, QueryFlow)]
                    current = (cdc or flows[name])[0]
                    raise FlowAnalysisError(
                        where=current.where,
                        flow=current.name,
                        problem=str(_in_pipeline(error, name)),
                    ) from error
                reads[name] = {names[r] for r in read if r in names and names[r] != name}
                if frames and "." not in name:
                    _placeholder(*frames[0]).createOrReplaceTempView(name)
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
    return Graph([registry.datasets[n] for n in order], flows, reads)


def _cycle(blocked: dict[str, tuple[str, Flow]]) -> CycleError:
    """Follow the waits from any blocked dataset until one repeats."""
    start = next(iter(blocked))
    path = [start]
    while blocked[path[-1]][0] not in path:
        path.append(blocked[path[-1]][0])
    cycle = [*path[path.index(blocked[path[-1]][0]) :], blocked[path[-1]][0]]
    return CycleError(cycle=" -> ".join(cycle), where=blocked[cycle[0]][1].where)


def _in_pipeline(error: AutoCdcError, dataset: str) -> AutoCdcError:
    """``error`` with the remedy a pipeline's user runs (not a flow object's call)."""
    if isinstance(error, DefinitionChangedError | TargetNotPartialError):
        remedy = (
            f"`autocdc run --full-refresh {dataset}` (`full_refresh={{'{dataset}'}}` in dp.run)"
        )
        return type(error)(**{**error.params, "remedy": remedy})
    return error
