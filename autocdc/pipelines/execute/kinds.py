"""What a run does with each kind of flow: one small class a kind, each with ``build``
(its DataFrame, checked, while the pipeline resolves), ``placeholder`` (what readers of
its target see until the target exists), ``start`` (its work in a run) and ``reset``
(a full refresh of what it keeps beside its target). The graph builds one per flow
(:func:`place`), with the flow's running engine, once a run; neither the graph nor the
runner asks a flow what it is: the functions at the end of this module answer what the
graph's checks, a replay and a fresh read need to know of a flow's kind.

* :class:`AppendKind`: a query appended to a streaming table (its own, or an append
  flow's), a Delta stream;
* :class:`ViewKind`: a temporary view's query, defined in order;
* :class:`MaterializedViewKind`: a materialized view's query, recomputed after its inputs;
* :class:`ChangeKind`: AUTO CDC from a change feed, each micro-batch applied in
  ``foreachBatch`` (a batch source, a once flow: one batch);
* :class:`ExtractionKind`: AUTO CDC from an extraction source, one read a run;
* :class:`SnapshotKind`: AUTO CDC FROM SNAPSHOT, each newer snapshot applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import LongType

from autocdc.engine import (
    AutoCdcFlow,
    AutoCdcSnapshotFlow,
    BatchMetrics,
    col,
    sequence_type,
    session_conf,
)
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.declare.registry import (
    CdcFlow,
    Dataset,
    Flow,
    QueryFlow,
    Registry,
    SnapshotFlow,
)
from autocdc.pipelines.errors import BatchQueryForStreamingTableError
from autocdc.pipelines.execute import extraction, interrupt, replay
from autocdc.sources.extract import Extraction, Strategy, resolve_options

if TYPE_CHECKING:
    from autocdc.pipelines.execute.options import Options

CHANGE_TYPE = "_change_type"  # a Delta change data feed's operation column
APPLIED = "autocdc-applied-batch"
RAN_ONCE = "autocdc-ran-once"  # a once flow's note: it ran, since its last full refresh
VALIDITY = ("__START_AT", "__END_AT")


def say(message: str) -> None:
    print(f"autocdc: {message}", flush=True)


class Runner(Protocol):
    """What a kind asks of the run that starts it (:class:`runner.Runner`, which imports
    the kinds: they know it by this much only)."""

    spark: SparkSession
    project: Project

    def started(self, flow: str, target: str, df: DataFrame | None) -> None: ...

    def stopped(self, flow: str, target: str) -> None: ...

    def applied(
        self,
        flow: str,
        target: str,
        metrics: BatchMetrics,
        stream_batch_id: int | None,
        position: list[dict] | None = None,
    ) -> None: ...

    def guarded(
        self, flow: str, apply: Callable[[DataFrame], BatchMetrics], df: DataFrame
    ) -> BatchMetrics: ...

    def triggered(
        self, writer: DataStreamWriter, flow: str, options: Options
    ) -> DataStreamWriter: ...

    def follow_a_move(self, flow: str, dataset: str, checkpoint: Path) -> None: ...

    def missing_inputs(self, dataset: Dataset) -> list[str]: ...

    def extraction_step(self, flow: str, source: Extraction, dataset: str) -> extraction.Step: ...


@dataclass
class Kind:
    """One flow of a run: ``flow`` into ``dataset``, whose table is ``target``."""

    flow: Flow
    dataset: Dataset
    target: str
    # An AUTO CDC flow: its errors are the dataset's to report (before a query flow's).
    applies_changes: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.flow.name

    def build(self, spark: SparkSession, fresh: bool = False) -> DataFrame | None:
        """The flow's DataFrame, checked (an AUTO CDC flow's against its stored tables,
        or as a new target when ``fresh``); None: nothing to read."""
        raise NotImplementedError

    def placeholder(self, df: DataFrame) -> DataFrame:
        """What readers of the target see while resolving, from the flow's DataFrame."""
        return df

    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        """Its work in a run: a streaming query started, or done (None)."""
        raise NotImplementedError

    def reset(self, spark: SparkSession) -> None:
        """A full refresh of what the flow keeps beside its target (the runner drops the
        target and the checkpoint)."""

    def apply_staged(self, run: Runner, due_only: bool = False) -> BatchMetrics | None:
        """What a flow with ``max_staleness`` staged, applied; None: nothing (or no
        ``max_staleness``)."""
        return None

    @property
    def stages(self) -> bool:
        """Whether the flow stages its micro-batches (``max_staleness``)."""
        return False


@dataclass
class QueryKind(Kind):
    flow: QueryFlow

    def build(self, spark: SparkSession, fresh: bool = False) -> DataFrame | None:
        return self.flow.query()


@dataclass
class AppendKind(QueryKind):
    def build(self, spark: SparkSession, fresh: bool = False) -> DataFrame | None:
        df = self.flow.query()
        if not df.isStreaming:
            raise BatchQueryForStreamingTableError(
                where=self.flow.where, flow=self.name, target=self.target
            )
        return df

    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        checkpoint = run.project.checkpoint(self.name)
        with session_conf(run.spark, self.flow.spark_conf):
            df = self.build(run.spark)
            assert df is not None
            run.started(self.name, self.target, df)
            run.follow_a_move(self.name, self.dataset.name, checkpoint)
            writer = df.writeStream.format("delta").outputMode("append")
            if self.dataset.partition_cols:
                writer = writer.partitionBy(*self.dataset.partition_cols)
            return run.triggered(writer, self.name, options).toTable(self.target)


@dataclass
class ViewKind(QueryKind):
    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        with session_conf(run.spark, self.flow.spark_conf):
            self.flow.query().createOrReplaceTempView(self.dataset.name)
        return None


@dataclass
class MaterializedViewKind(QueryKind):
    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        """Recompute the view, unless a table it reads does not exist yet: an AUTO CDC
        target is created by its first micro-batch, which a continuous run has not waited
        for, and a source with nothing in it yet never runs one."""
        missing = run.missing_inputs(self.dataset)
        if missing:
            said = f"waiting for {', '.join(missing)} (no rows yet)"
            say(f"materialized view {self.target}: {said}")
            return None
        with session_conf(run.spark, self.flow.spark_conf):
            df = self.flow.query()
            df.write.format("delta").mode("overwrite").option(
                "overwriteSchema", "true"
            ).saveAsTable(self.target)
        say(f"materialized view {self.target}: {run.spark.table(self.target).count()} rows")
        return None


@dataclass
class ChangeKind(Kind):
    """``engine``: the flow's running engine, built once a run."""

    flow: CdcFlow
    engine: AutoCdcFlow
    applies_changes: ClassVar[bool] = True

    def frame(self, spark: SparkSession) -> DataFrame:
        """The change feed (a once flow's as one batch); a Delta change data feed's
        pre-images are dropped (each update's post-image carries the change)."""
        reader = spark.readStream if self.flow.streaming and not self.flow.once else spark.read
        df = reader.table(self.flow.source)
        if CHANGE_TYPE in df.columns:
            df = df.where(F.col(CHANGE_TYPE) != "update_preimage")
        return df

    def build(self, spark: SparkSession, fresh: bool = False) -> DataFrame | None:
        df = self.frame(spark)
        self.engine.check(df, fresh)
        return df

    def placeholder(self, df: DataFrame) -> DataFrame:
        """The selected columns (and for SCD type 2, the validity columns, of the
        sequence's type)."""
        engine = self.engine
        listing = engine.columns_to_update_column
        excepted = [*(engine.except_column_list or []), *engine.pseudo_columns, listing]
        keep = engine.column_list or [c for c in df.columns if c not in excepted]
        out = df.select(*[col(c) for c in keep])
        if engine.stored_as_scd_type == 2:
            seq_type = df.select(engine.sequence_column()).schema[0].dataType
            out = out.select("*", *[F.lit(None).cast(seq_type).alias(c) for c in VALIDITY])
        return out

    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        """The flow's query (checked when the pipeline resolved): each micro-batch applied
        once (a replay is skipped); a batch source applied as one batch."""
        checkpoint = run.project.checkpoint(self.name)
        replay.finish(checkpoint)  # a replay's rewind a kill interrupted
        ran = checkpoint / RAN_ONCE
        if self.flow.once and ran.is_file():
            said = f"ran once already (a full refresh of {self.target} runs it again)"
            say(f"flow {self.name}: {said}")
            return None
        df = self.frame(run.spark)
        run.started(self.name, self.target, df)
        run.follow_a_move(self.name, self.dataset.name, checkpoint)
        if not df.isStreaming:  # a batch source: the whole table is one batch
            run.applied(self.name, self.target, run.guarded(self.name, self.engine.apply, df), None)
            if self.flow.once:
                checkpoint.mkdir(parents=True, exist_ok=True)
                ran.touch()
            run.stopped(self.name, self.target)
            return None
        writer = df.writeStream.foreachBatch(self._applier(run))
        return run.triggered(writer, self.name, options).start()

    def _applier(self, run: Runner) -> Callable[[DataFrame, int], None]:
        note = run.project.checkpoint(self.name) / APPLIED

        def apply(batch: DataFrame, batch_id: int) -> None:
            if note.is_file() and int(note.read_text()) >= batch_id:
                say(f"flow {self.name}: batch {batch_id} already applied")
                return
            # The event before the note: a crash between them replays the batch (a no-op
            # in the engine) and logs it twice rather than never.
            metrics = run.guarded(self.name, self.engine.apply, batch)
            run.applied(self.name, self.target, metrics, batch_id)
            partial = note.with_suffix(".tmp")
            partial.write_text(str(batch_id))
            partial.replace(note)

        return apply

    def reset(self, spark: SparkSession) -> None:
        self.engine.full_refresh(spark)

    @property
    def stages(self) -> bool:
        return self.engine.max_staleness is not None

    def apply_staged(self, run: Runner, due_only: bool = False) -> BatchMetrics | None:
        if not self.stages:
            return None
        spark = run.spark
        metrics = self.engine.apply_if_due(spark) if due_only else self.engine.apply_staged(spark)
        if metrics is not None:
            run.applied(self.name, self.target, metrics, None)
        return metrics


@dataclass
class ExtractionKind(ChangeKind):
    """A change flow over an extraction source: its changes ordered by ``sequence_by``,
    then by the run's read (:func:`extraction.sequence`)."""

    def frame(self, spark: SparkSession) -> DataFrame:
        """The source's columns and no rows: the runner reads it."""
        assert self.flow.extraction is not None
        return extraction.frame(spark, self.flow.extraction)

    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        """One run of the source: its rows read, applied as one batch in the order of the
        read, then its checkpoint moved (:mod:`extraction`)."""
        source = self.flow.extraction
        assert source is not None
        run.started(self.name, self.target, None)
        step = run.extraction_step(self.name, source, self.dataset.name)
        chosen = resolve_options(options.extract, self.flow.extract_options, source.options)

        def apply(df: DataFrame, read: int) -> BatchMetrics:
            by = extraction.sequence(self.flow.definition.sequence_by, read)
            return run.guarded(self.name, AutoCdcFlow.of(self.engine, sequence_by=by).apply, df)

        done = step.run(run.spark, chosen, apply)
        run.applied(self.name, self.target, done.result, None, [done.position(source.name)])
        run.stopped(self.name, self.target)
        return None


@dataclass
class SnapshotKind(Kind):
    """``engine``: the flow's running snapshot engine, built once a run."""

    flow: SnapshotFlow
    engine: AutoCdcSnapshotFlow
    applies_changes: ClassVar[bool] = True

    def build(self, spark: SparkSession, fresh: bool = False) -> DataFrame | None:
        """The next snapshot (None: its function has nothing newer); an extraction
        source's columns and no rows (the runner reads it)."""
        if self.flow.extraction is not None:
            df = extraction.frame(spark, self.flow.extraction)
            self.engine.check(df, fresh)
            return df
        return self.engine.peek(spark, self.flow.source, fresh)

    def placeholder(self, df: DataFrame) -> DataFrame:
        """The snapshot's columns but its position's (a column ``sequence_by`` names is
        not the target's), and for SCD type 2 the validity columns (a snapshot's version
        is a bigint)."""
        position = self.engine.sequence_by
        out = df.drop(position) if isinstance(position, str) else df
        if self.engine.stored_as_scd_type == 2:
            return out.select("*", *[F.lit(None).cast(LongType()).alias(c) for c in VALIDITY])
        return out

    def start(self, run: Runner, options: Options) -> StreamingQuery | None:
        """Every snapshot newer than the last one processed, each logged as a batch."""
        run.started(self.name, self.target, None)

        def applied(version: int, metrics: BatchMetrics) -> None:
            say(f"flow {self.name}: snapshot {version} applied")
            run.applied(self.name, self.target, metrics, None)
            interrupt.check()  # a safe point: the snapshot and its version are recorded

        expected = self.dataset.name in options.expect_deletes
        source = self.flow.extraction
        if source is None:
            self.engine.run(run.spark, self.flow.source, applied, expected)
        else:  # a STATELESS extraction: this run's read is the next snapshot
            step = run.extraction_step(self.name, source, self.dataset.name)
            chosen = resolve_options(options.extract, None, source.options)
            # A snapshot is numbered by run: the read's own sequence is not needed.
            step.run(run.spark, chosen, lambda df, _: self._view(run, df, applied, expected))
        run.stopped(self.name, self.target)
        return None

    def _view(
        self,
        run: Runner,
        snapshot: DataFrame,
        applied: Callable[[int, BatchMetrics], None],
        expect_deletes: bool,
    ) -> None:
        """Apply an extraction's read as the next snapshot of a view, so it is numbered by
        run as any view is (:mod:`autocdc.engine.snapshot`: a number a killed attempt
        used is not given to other rows)."""
        view = "__autocdc_snapshot_" + re.sub(r"\W", "_", self.engine.flow_name)
        snapshot.createOrReplaceTempView(view)
        try:
            self.engine.run(run.spark, view, applied, expect_deletes)
        finally:
            run.spark.catalog.dropTempView(view)

    def reset(self, spark: SparkSession) -> None:
        self.engine.full_refresh(spark)


_QUERY_KINDS: dict[str, type[QueryKind]] = {
    "streaming_table": AppendKind,
    "temporary_view": ViewKind,
    "materialized_view": MaterializedViewKind,
}


def place(
    registry: Registry, flows: dict[str, list[Flow]], qualify: Callable[[str], str]
) -> dict[str, Kind]:
    """Each flow's kind (by flow name), an AUTO CDC flow's with its running engine, built
    from its definition as this run places it: at its qualified target, with the
    target's ``cluster_by`` and ``table_properties`` (the engine creates the target with
    them), declaring the target partial when a flow into it is (the target's state,
    which they share, must record which columns each upsert set, whichever flow creates
    it), and on the clock of a snapshot flow into it (``snapshot_target``: the clock is
    the target's, whichever flow creates it). A flow over an extraction source orders its
    changes by the read too (read 0 until a read is applied: the definition checks need
    only its type)."""
    kinds: dict[str, Kind] = {}
    for name, into in flows.items():
        dataset = registry.datasets[name]
        target = qualify(name)
        table: dict[str, Any] = {"target": target}
        if dataset.cluster_by:
            table["cluster_by"] = list(dataset.cluster_by)
        if dataset.table_properties:
            table["table_properties"] = dict(dataset.table_properties)
        if any(f.definition.partial for f in into if isinstance(f, CdcFlow)):
            table["partial_target"] = True
        if any(isinstance(f, SnapshotFlow) for f in into):  # one clock for all
            table["snapshot_target"] = True
        for flow in into:
            kinds[flow.name] = _KINDS[type(flow)](flow, dataset, target, table)
    return kinds


def _query(flow: QueryFlow, dataset: Dataset, target: str, _table: dict) -> Kind:
    return _QUERY_KINDS[dataset.kind](flow, dataset, target)


def _snapshot(flow: SnapshotFlow, dataset: Dataset, target: str, _table: dict) -> Kind:
    return SnapshotKind(
        flow, dataset, target, AutoCdcSnapshotFlow.of(flow.definition, target=target)
    )


def _changes(flow: CdcFlow, dataset: Dataset, target: str, table: dict) -> Kind:
    if flow.extraction is None:
        return ChangeKind(flow, dataset, target, AutoCdcFlow.of(flow.definition, **table))
    by = extraction.sequence(flow.definition.sequence_by, 0)
    engine = AutoCdcFlow.of(flow.definition, **table, sequence_by=by)
    return ExtractionKind(flow, dataset, target, engine)


# A definition's kind, by its class: the one place a run tells flows apart.
_KINDS: dict[type, Callable[[Any, Dataset, str, dict], Kind]] = {
    QueryFlow: _query,
    SnapshotFlow: _snapshot,
    CdcFlow: _changes,
}


# What a flow is, asked of its definition here only (the graph's checks, a replay's).


def is_query(flow: Flow) -> bool:
    """A query's flow (a dataset's own, or an append flow), not AUTO CDC."""
    return isinstance(flow, QueryFlow)


def change_flow(flow: Flow) -> CdcFlow | None:
    """``flow`` as an AUTO CDC flow from a change feed (None: it is another kind)."""
    return flow if isinstance(flow, CdcFlow) else None


def change_flows(flows: list[Flow]) -> list[CdcFlow]:
    """The AUTO CDC flows from a change feed among ``flows``."""
    return [f for f in flows if isinstance(f, CdcFlow)]


def snapshot_flow(flows: list[Flow]) -> SnapshotFlow | None:
    """The first AUTO CDC FROM SNAPSHOT flow among ``flows`` (None: there is none)."""
    return next((f for f in flows if isinstance(f, SnapshotFlow)), None)


def change_kinds(kinds: list[Kind]) -> list[ChangeKind]:
    """The kinds of AUTO CDC flows from a change feed (an extraction source's too) among
    ``kinds``."""
    return [k for k in kinds if isinstance(k, ChangeKind)]


def unreplayable(flow: Flow) -> str | None:
    """Why ``flow`` cannot be replayed (None: it can, :mod:`replay`)."""
    if isinstance(flow, SnapshotFlow):
        return "it is a snapshot flow (each run reads its whole source)"
    if isinstance(flow, QueryFlow):
        return "it is an append flow: the rows it read again would be appended twice"
    if flow.extraction is not None and flow.extraction.strategy is not Strategy.WATERMARK:
        strategy = flow.extraction.strategy.value
        return f"its source is a {strategy} extraction (only a WATERMARK one has positions)"
    if flow.once:
        return "it is a once flow (a full refresh of its target runs it again)"
    return None


def check_clock(frames: list[tuple[Kind, DataFrame | None]]) -> None:
    """A snapshot flow sharing its target: its position must be of the change flows'
    sequence type, checked before anything runs."""
    built = [(k, df) for k, df in frames if df is not None]
    snapshot = next(((k, df) for k, df in built if isinstance(k, SnapshotKind)), None)
    if snapshot is None or snapshot[0].engine.sequence_by is None:
        return
    kind, position = snapshot
    for other, df in built:
        if isinstance(other, ChangeKind):
            changes = sequence_type(df, other.engine)
            kind.engine.check_clock(changes, position, f"change flow `{other.name}`'s")
