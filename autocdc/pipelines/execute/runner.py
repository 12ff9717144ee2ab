"""Run a resolved pipeline: each dataset in dependency order.

A streaming table's flows run as Structured Streaming queries, checkpointed under the
project's ``storage`` (one folder per flow); an AUTO CDC flow hands each micro-batch to
``AutoCdcFlow.apply`` in ``foreachBatch``. Materialized views are recomputed after their
inputs, temporary views are defined in order. By default every query processes what is
available and stops (``availableNow``); ``continuous`` keeps them running.

Every run writes its events (run, flows, each micro-batch with its metrics, source
position and lag, errors) to the pipeline's event log, one commit per event.

Exactly once: Spark replays a micro-batch whose commit it did not record, with the same
id and the same input. The id of the last batch applied is kept beside the checkpoint,
so a replay is skipped; a crash between the apply and that note replays the batch into
the engine, where a repeated change is a no-op by design.

A once flow (a backfill) applies its source as one batch, then notes in its checkpoint
folder that it ran; later runs skip it. A full refresh of its target removes the folder,
so the next run applies it again; a run killed before the note applies it again too,
and the engine absorbs the repeated changes.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from autocdc.engine.errors import AutoCdcError, raised_in_worker
from autocdc.engine.flow import AutoCdcFlow
from autocdc.engine.metrics import BatchMetrics
from autocdc.engine.snapshot import AutoCdcSnapshotFlow
from autocdc.engine.tuning import session_conf
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.declare.registry import CdcFlow, Dataset, Flow, QueryFlow, SnapshotFlow
from autocdc.pipelines.errors import (
    CheckpointElsewhereError,
    SourceDataLostError,
    UnknownDatasetError,
)
from autocdc.pipelines.execute import extraction, interrupt, lock
from autocdc.pipelines.execute import graph as g
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute.eventlog import EventLog
from autocdc.pipelines.execute.progress import Progress, outcome
from autocdc.sources.errors import DebeziumSchemaChangedError
from autocdc.sources.extract import Extraction, ExtractionOptions, resolve_options

APPLIED = "autocdc-applied-batch"
RAN_ONCE = "autocdc-ran-once"  # a once flow's note: it ran, since its last full refresh


@dataclass
class Options:
    full_refresh: set[str] = field(default_factory=set)
    full_refresh_all: bool = False
    refresh: set[str] | None = None  # None: every dataset
    continuous: bool = False
    trigger_seconds: float = 10.0
    extract: ExtractionOptions | None = None  # replace every extraction flow's and source's
    # Datasets whose snapshot flows may delete beyond their max_delete_fraction this run.
    expect_deletes: set[str] = field(default_factory=set)

    def resets(self, name: str) -> bool:
        """Whether dataset ``name`` is dropped by a full refresh before it runs."""
        return self.full_refresh_all or name in self.full_refresh


def qualifier(database: str | None) -> Callable[[str], str]:
    """Dataset name -> table name: unqualified names live in the spec's database."""
    return lambda name: f"{database}.{name}" if database and "." not in name else name


def data_lost(error: BaseException, flow: str, dataset: str) -> SourceDataLostError | None:
    """The error to raise instead of Spark's when a Kafka source's checkpoint is ahead of
    its broker (a broker started anew): Spark's says to set ``failOnDataLoss``, which
    would skip the gap silently, not that a full refresh starts over."""
    said = str(error).lower()
    signs = ("kafka_data_loss", "some data may have been lost", "some data may have been missed")
    if not any(sign in said for sign in signs):
        return None
    return SourceDataLostError(flow=flow, dataset=dataset)


def say(message: str) -> None:
    print(f"autocdc: {message}", flush=True)


class Runner:
    def __init__(
        self,
        spark: SparkSession,
        project: Project,
        graph: g.Graph,
        progress: Progress | None = None,
    ) -> None:
        self.spark = spark
        self.project = project
        self.graph = graph
        # flow, its dataset, target, query
        self.queries: list[tuple[Flow, Dataset, str, StreamingQuery]] = []
        self.events = EventLog.of(project)
        self.progress = progress or Progress()
        self.sources: dict[str, list[dict]] = {}  # flow -> its streaming sources
        self.failure: BaseException | None = None  # the first error inside an apply

        self.qualify = qualifier(project.database)

    def run(self, options: Options) -> None:
        """Run the pipeline once (or until stopped, ``continuous``), logging its events."""
        self.events.write("run_started")
        try:
            with self.progress:
                self._run(options)
        except BaseException as error:
            # The error inside foreachBatch, not Spark's StreamingQueryException around it;
            # an autocdc error a source raised in a Python worker, rebuilt from its text.
            cause = self.failure or error
            ours = cause if isinstance(cause, AutoCdcError) else raised_in_worker(cause)
            self.events.write("run_failed", error=ours or cause)
            if ours is not None and ours is not error:
                raise ours from error
            raise
        self.events.write("run_finished")

    def _run(self, options: Options) -> None:
        names = [d.name for d in self.graph.order if d.kind != "temporary_view"]
        named = options.full_refresh | (options.refresh or set()) | options.expect_deletes
        unknown = named - set(names)
        if unknown:
            raise UnknownDatasetError(names=sorted(unknown), known=names)
        resetting = {name for name in names if options.resets(name)}
        selected = set(names) if options.refresh is None else options.refresh | resetting
        for dataset in self.graph.order:
            if dataset.name in resetting:
                self._reset(dataset)
        for dataset in self.graph.order:
            interrupt.check()
            if dataset.kind == "temporary_view":
                self._view(dataset)
            elif dataset.name in selected:
                self._update(dataset, options)
        if options.continuous:
            self._keep_running(options)
        for dataset in self.graph.order:  # temporary views live in the pipeline only
            if dataset.kind == "temporary_view":
                self.spark.catalog.dropTempView(dataset.name)

    def _view(self, dataset: Dataset) -> None:
        for flow in self.graph.flows[dataset.name]:
            assert isinstance(flow, QueryFlow)
            with session_conf(self.spark, flow.spark_conf):
                flow.query().createOrReplaceTempView(dataset.name)

    def _update(self, dataset: Dataset, options: Options) -> None:
        target = self.qualify(dataset.name)
        if dataset.kind == "materialized_view":
            (flow,) = self.graph.flows[dataset.name]
            self.events.write("flow_started", flow=flow.name, target=target)
            self._materialize(dataset)
            self.events.write("flow_stopped", flow=flow.name, target=target)
            return
        for flow in self.graph.flows[dataset.name]:
            try:
                interrupt.check()
                query = self._start(flow, dataset, target, options)
                if query is not None and not options.continuous:
                    query.awaitTermination()
                    interrupt.check()  # Ctrl-C stopped it, short of up to date
                if not options.continuous:  # a triggered run ends with nothing staged
                    self.apply_staged(flow, target)
            except BaseException as error:
                lost = data_lost(self.failure or error, flow.name, dataset.name)
                self.events.write(
                    "error", flow=flow.name, target=target, error=lost or self.failure or error
                )
                if lost is not None:
                    raise lost from error
                raise
            if query is None:
                continue
            if options.continuous:
                self.queries.append((flow, dataset, target, query))
            else:
                self._stopped(flow.name, target)
                say(f"flow {flow.name}: up to date")

    def apply_staged(self, flow: Flow, target: str, due_only: bool = False) -> BatchMetrics | None:
        """Apply what a flow with ``max_staleness`` staged (``due_only``: if it is due),
        logged as a batch: at a triggered run's end, by ``autocdc apply``, and in a
        continuous run when a quiet source leaves staged changes older than allowed."""
        if not isinstance(flow, CdcFlow) or flow.definition.max_staleness is None:
            return None
        engine = self._engine(flow)
        metrics = engine.apply_if_due(self.spark) if due_only else engine.apply_staged(self.spark)
        if metrics is not None:
            self._applied(flow.name, target, metrics, None)
        return metrics

    def apply_all(self, names: set[str]) -> None:
        """``autocdc apply``: apply what every flow with ``max_staleness`` into the named
        datasets (none named: every dataset) staged."""
        known = [d.name for d in self.graph.order if d.kind != "temporary_view"]
        unknown = names - set(known)
        if unknown:
            raise UnknownDatasetError(names=sorted(unknown), known=known)
        staging = 0
        for dataset in self.graph.order:
            if dataset.kind == "temporary_view" or (names and dataset.name not in names):
                continue
            for flow in self.graph.flows[dataset.name]:
                if isinstance(flow, CdcFlow) and flow.definition.max_staleness is not None:
                    staging += 1
                    if self.apply_staged(flow, self.qualify(dataset.name)) is None:
                        say(f"flow {flow.name}: nothing staged")
        if not staging:
            say("no flow with max_staleness: nothing to apply")

    def _materialize(self, dataset: Dataset) -> None:
        """Recompute a materialized view, unless a table it reads does not exist yet: an
        AUTO CDC target is created by its first micro-batch, which a continuous run has
        not waited for, and a source with nothing in it yet never runs one."""
        target = self.qualify(dataset.name)
        missing = self._missing_inputs(dataset)
        if missing:
            say(f"materialized view {target}: waiting for {', '.join(missing)} (no rows yet)")
            return
        (flow,) = self.graph.flows[dataset.name]
        assert isinstance(flow, QueryFlow)
        with session_conf(self.spark, flow.spark_conf):
            df = flow.query()
            df.write.format("delta").mode("overwrite").option(
                "overwriteSchema", "true"
            ).saveAsTable(target)
        say(f"materialized view {target}: {self.spark.table(target).count()} rows")

    def _missing_inputs(self, dataset: Dataset) -> list[str]:
        kinds = {d.name: d.kind for d in self.graph.order}
        return sorted(
            self.qualify(name)
            for name in self.graph.reads.get(dataset.name, set())
            if kinds.get(name) != "temporary_view"
            and not self.spark.catalog.tableExists(self.qualify(name))
        )

    def _started(self, flow: str, target: str, df: DataFrame | None) -> None:
        streaming = df is not None and df.isStreaming
        self.sources[flow] = pos.sources(df, self.project.root) if streaming else []
        self.progress.started(flow, self._flow_event("flow_started", flow, target))

    def _stopped(self, flow: str, target: str) -> None:
        self.progress.stopped(flow, self._flow_event("flow_stopped", flow, target))

    def _flow_event(self, event_type: str, flow: str, target: str) -> pos.Lag | None:
        """Log a flow starting or stopping, at the position its checkpoint last committed
        and with the lag from there; returns the lag (None: not a streaming source)."""
        checkpoint = self.project.checkpoint(flow)
        found = self.sources.get(flow, [])
        ends = pos.offsets(checkpoint, pos.committed(checkpoint))
        lag = pos.lag(found, ends, checkpoint) if found else None
        position = pos.position(found, ends) if found else None
        self.events.write(event_type, flow=flow, target=target, position=position, lag=lag)
        return lag

    def _applied(
        self,
        flow: str,
        target: str,
        metrics: BatchMetrics,
        stream_batch_id: int | None,
        position: list[dict] | None = None,
    ) -> None:
        """Log one applied batch: the event (with the offsets it reached and the lag after
        it, or the ``position`` a batch source gives), the metrics line and the progress."""
        checkpoint = self.project.checkpoint(flow)
        found = self.sources.get(flow, [])
        ends = pos.offsets(checkpoint, stream_batch_id) if stream_batch_id is not None else []
        lag = pos.lag(found, ends, checkpoint) if found else None
        self.events.write(
            "batch",
            flow=flow,
            target=target,
            metrics=metrics,
            stream_batch_id=stream_batch_id,
            position=pos.position(found, ends) if found else position,
            lag=lag,
        )
        self._log(metrics)
        # The micro-batch as the user sees it (the query's); a batch source's is its commit.
        number = metrics.batch_id if stream_batch_id is None else stream_batch_id
        self.progress.batch(flow, number, metrics.rows_in, metrics.seconds, lag)

    def _apply(self, apply: Callable[[DataFrame], BatchMetrics], df: DataFrame) -> BatchMetrics:
        try:
            return apply(df)
        except BaseException as error:
            self.failure = self.failure or error
            raise

    def _snapshots(
        self, flow: SnapshotFlow, dataset: Dataset, target: str, options: Options
    ) -> None:
        """Apply every snapshot newer than the last one processed, each logged as a batch."""
        self._started(flow.name, target, None)

        def applied(version: int, metrics: BatchMetrics) -> None:
            say(f"flow {flow.name}: snapshot {version} applied")
            self._applied(flow.name, target, metrics, None)
            interrupt.check()  # a safe point: the snapshot and its version are recorded

        engine = self.graph.engines[flow.name]
        assert isinstance(engine, AutoCdcSnapshotFlow)
        expected = dataset.name in options.expect_deletes
        if flow.extraction is None:
            engine.run(self.spark, flow.source, applied, expected)
        else:  # a STATELESS extraction: this run's read is the next snapshot
            step = self._step(flow.name, flow.extraction, dataset.name)
            chosen = resolve_options(options.extract, None, flow.extraction.options)
            # A snapshot is numbered by run: the read's own sequence is not needed.
            step.run(
                self.spark,
                chosen,
                lambda df, _: self._snapshot_view(engine, df, applied, expected),
            )
        self._stopped(flow.name, target)

    def _snapshot_view(
        self,
        engine: AutoCdcSnapshotFlow,
        snapshot: DataFrame,
        applied: Callable[[int, BatchMetrics], None],
        expect_deletes: bool,
    ) -> None:
        """Apply an extraction's read as the next snapshot of a view, so it is numbered by
        run as any view is (:mod:`autocdc.engine.snapshot`: a number a killed attempt
        used is not given to other rows)."""
        view = "__autocdc_snapshot_" + re.sub(r"\W", "_", engine.flow_name)
        snapshot.createOrReplaceTempView(view)
        try:
            engine.run(self.spark, view, applied, expect_deletes)
        finally:
            self.spark.catalog.dropTempView(view)

    def _start(
        self, flow: Flow, dataset: Dataset, target: str, options: Options
    ) -> StreamingQuery | None:
        if isinstance(flow, SnapshotFlow):
            self._snapshots(flow, dataset, target, options)
            return None
        checkpoint = self.project.checkpoint(flow.name)
        ran = checkpoint / RAN_ONCE
        if isinstance(flow, CdcFlow) and flow.once and ran.is_file():
            say(f"flow {flow.name}: ran once already (a full refresh of {target} runs it again)")
            return None
        with session_conf(self.spark, getattr(flow, "spark_conf", {})):
            df = g.build(flow, dataset, self.spark, target, self.graph.engines.get(flow.name))
            self._started(flow.name, target, df)
            self._follow_a_move(flow.name, dataset.name, checkpoint)
            if isinstance(flow, CdcFlow):
                if flow.extraction is not None:
                    self._extract(flow, dataset, target, options)
                    self._stopped(flow.name, target)
                    return None
                engine = self._engine(flow)
                if not df.isStreaming:  # a batch source: the whole table is one batch
                    self._applied(flow.name, target, self._apply(engine.apply, df), None)
                    if flow.once:
                        checkpoint.mkdir(parents=True, exist_ok=True)
                        ran.touch()
                    self._stopped(flow.name, target)
                    return None
                writer = df.writeStream.foreachBatch(self._applier(engine, target, checkpoint))
            else:
                writer = df.writeStream.format("delta").outputMode("append")
                if dataset.partition_cols:
                    writer = writer.partitionBy(*dataset.partition_cols)
            writer = writer.option("checkpointLocation", str(checkpoint)).queryName(flow.name)
            if options.continuous:
                writer = writer.trigger(processingTime=f"{options.trigger_seconds} seconds")
            else:
                writer = writer.trigger(availableNow=True)
            if isinstance(flow, CdcFlow):
                return writer.start()
            return writer.toTable(target)

    def _follow_a_move(self, flow: str, dataset: str, checkpoint: Path) -> None:
        """A checkpoint that names files elsewhere (Spark keeps absolute paths) is translated
        when the whole project moved with its sources (the run holds the lock), and refused
        when a source moved on its own, before Spark fails on it or reads files twice."""
        moved = pos.elsewhere(self.sources[flow], checkpoint)
        if moved is None:
            return
        recorded, location = moved
        root = self.project.root.resolve()
        old = pos.moved_with_project(recorded, location, root)
        if old is None:
            raise CheckpointElsewhereError(
                flow=flow, recorded=recorded, location=location, dataset=dataset
            )
        rewritten = pos.translate(checkpoint, old, root)
        said = f"flow {flow}: the project moved from {old} to {root}; its checkpoint follows"
        say(f"{said} ({rewritten} source logs translated)")
        self.events.write("checkpoint_moved", flow=flow, message=said)

    def _extract(
        self,
        flow: CdcFlow,
        dataset: Dataset,
        target: str,
        run: Options,
    ) -> None:
        """One run of a flow that reads an extraction source: its rows read, applied as one
        batch in the order of the read, then its checkpoint moved (:mod:`extraction`)."""
        source = flow.extraction
        assert source is not None
        step = self._step(flow.name, source, dataset.name)
        options = resolve_options(run.extract, flow.extract_options, source.options)

        def apply(df: DataFrame, read: int) -> BatchMetrics:
            by = extraction.sequence(flow.definition.sequence_by, read)
            return self._apply(AutoCdcFlow.of(self._engine(flow), sequence_by=by).apply, df)

        done = step.run(self.spark, options, apply)
        self._applied(flow.name, target, done.result, None, [done.position(source.name)])

    def _engine(self, flow: CdcFlow) -> AutoCdcFlow:
        """The running flow the graph built for ``flow``."""
        engine = self.graph.engines[flow.name]
        assert isinstance(engine, AutoCdcFlow)
        return engine

    def _step(self, flow: str, source: Extraction, dataset: str) -> extraction.Step:
        return extraction.Step(
            source=source,
            flow=flow,
            dataset=dataset,
            checkpoints=self.project.checkpoint(flow),
            storage=self.project.storage_path,
            pipeline=self.project.name,
            expiry=lock.expiry_seconds(self.project),
            say=say,
        )

    def _applier(self, engine: AutoCdcFlow, target: str, checkpoint: Path):
        note = checkpoint / APPLIED
        name = engine.name or engine.target

        def apply(batch: DataFrame, batch_id: int) -> None:
            if note.is_file() and int(note.read_text()) >= batch_id:
                say(f"flow {name}: batch {batch_id} already applied")
                return
            # The event before the note: a crash between them replays the batch (a no-op
            # in the engine) and logs it twice rather than never.
            self._applied(name, target, self._apply(engine.apply, batch), batch_id)
            partial = note.with_suffix(".tmp")
            partial.write_text(str(batch_id))
            partial.replace(note)

        return apply

    @staticmethod
    def _log(metrics: BatchMetrics) -> None:
        """The batch's outcome in words (``autocdc history`` has every count)."""
        said = f"{outcome(metrics.as_dict())}; {metrics.seconds:.1f} s"
        say(f"flow {metrics.flow}: {said} (commit {metrics.batch_id})")

    def _reset(self, dataset: Dataset) -> None:
        """Full refresh: drop the dataset's table (with its autocdc state and quarantine)
        and its flows' checkpoints, so the next run reprocesses the sources."""
        target = self.qualify(dataset.name)
        for flow in self.graph.flows[dataset.name]:
            shutil.rmtree(self.project.checkpoint(flow.name), ignore_errors=True)
            if flow.name in self.graph.engines:
                self.graph.engines[flow.name].full_refresh(self.spark)
        if self.spark.catalog.tableExists(target):
            location = self.spark.sql(f"DESCRIBE DETAIL {target}").first()["location"]
            self.spark.sql(f"DROP TABLE {target}")
            shutil.rmtree(location.removeprefix("file:"), ignore_errors=True)
        say(f"full refresh of {target}")

    def _keep_running(self, options: Options) -> None:
        """Until Ctrl-C or SIGTERM: streaming queries run on their trigger, materialized
        views are recomputed every interval; then every query stops cleanly (and Ctrl-C
        raises KeyboardInterrupt)."""
        stop: list[int] = []
        signal.signal(signal.SIGTERM, lambda number, _frame: stop.append(number))
        if not interrupt.active():  # a run not started by the CLI
            signal.signal(signal.SIGINT, lambda number, _frame: stop.append(number))
        interval = options.trigger_seconds
        say(f"running continuously (every {interval:g} s); Ctrl-C stops")
        while not (stop or interrupt.requested()):
            deadline = time.monotonic() + interval
            while not (stop or interrupt.requested()) and time.monotonic() < deadline:
                for i, (flow, dataset, target, query) in enumerate(self.queries):
                    error = query.exception()
                    if error is None:
                        continue
                    cause = self.failure or error
                    ours = raised_in_worker(cause) or data_lost(cause, flow.name, dataset.name)
                    self.events.write("error", flow=flow.name, target=target, error=ours or cause)
                    if isinstance(ours, SourceDataLostError):
                        raise ours from error
                    if not isinstance(ours, DebeziumSchemaChangedError):
                        raise error
                    self.failure = None
                    self.queries[i] = (flow, dataset, target, self._restart(flow, dataset, options))
                time.sleep(0.2)
            for flow, _dataset, target, _query in self.queries:
                if not (stop or interrupt.requested()):
                    self.apply_staged(flow, target, due_only=True)
            for dataset in self.graph.order:
                if dataset.kind == "materialized_view" and not (stop or interrupt.requested()):
                    self._materialize(dataset)
        for flow, _dataset, target, query in self.queries:
            query.stop()
            self._stopped(flow.name, target)
        interrupt.check()  # Ctrl-C exits 130 here too, as at any other moment
        say("stopped")

    def _restart(self, flow: Flow, dataset: Dataset, options: Options) -> StreamingQuery:
        """Start ``flow``'s query again over views built again: a Debezium source whose
        events gained a column takes it (the failed micro-batch was not applied, and runs
        again from the checkpoint)."""
        say(f"flow {flow.name}: its source's events gained columns; starting it again")
        for view in self.graph.order:
            if view.kind == "temporary_view":
                self._view(view)
        query = self._start(flow, dataset, self.qualify(dataset.name), options)
        assert query is not None
        return query
