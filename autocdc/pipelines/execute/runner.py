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

A flow's query that a kill stopped before it logged its first micro-batch is started
afresh (:mod:`autocdc.pipelines.execute.unstarted`); a flow whose work fails on an error
that is not autocdc's own is started again from its checkpoint, a few times, while the
others go on (:mod:`autocdc.pipelines.execute.retries`).

A replay (``Options.replay_from``) rewinds one flow's checkpoint to a position of its
source before anything is written (:mod:`autocdc.pipelines.execute.rewind`).

A once flow (a backfill) applies its source as one batch, then notes in its checkpoint
folder that it ran; later runs skip it. A full refresh of its target removes the folder,
so the next run applies it again; a run killed before the note applies it again too,
and the engine absorbs the repeated changes.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from autocdc.engine import BatchMetrics, fail_point
from autocdc.pipelines.declare.project import Project
from autocdc.pipelines.declare.registry import Dataset
from autocdc.pipelines.errors import (
    CheckpointElsewhereError,
    CheckpointNotEmptyError,
    FlowRetriesExhaustedError,
    SourceDataLostError,
    UnknownDatasetError,
)
from autocdc.pipelines.execute import extraction, interrupt, lock, replay, rewind, unstarted
from autocdc.pipelines.execute import graph as g
from autocdc.pipelines.execute import position as pos
from autocdc.pipelines.execute import retries as r
from autocdc.pipelines.execute.eventlog import EventLog
from autocdc.pipelines.execute.kinds import APPLIED, Kind, say
from autocdc.pipelines.execute.options import Options
from autocdc.pipelines.execute.progress import Progress, is_staged_apply, outcome
from autocdc.runtime import AutoCdcError, raised_in_worker
from autocdc.sources.errors import DebeziumSchemaChangedError
from autocdc.sources.extract import Extraction

STOPPED = "interrupted by the user"  # a run_stopped event's message


def _first_line(error: BaseException) -> str:
    """``ClassName: the message's first line`` (a streaming failure carries pages)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


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


def checkpoint_refused(
    error: BaseException, flow: str, dataset: str, checkpoint: Path
) -> CheckpointNotEmptyError | None:
    """The error to raise instead of Spark's when it will not start a flow's first
    micro-batch on a checkpoint that is not empty (what the runner clears before a start
    is not there: something else is)."""
    if "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" not in str(error):
        return None
    found = unstarted.leftovers(checkpoint)
    said = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return CheckpointNotEmptyError(
        flow=flow, dataset=dataset, checkpoint=checkpoint, found=said or "files"
    )


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
        self.queries: list[tuple[Kind, StreamingQuery]] = []  # a continuous run's
        self.events = EventLog.of(project)
        self.progress = progress or Progress()
        self.sources: dict[str, list[dict]] = {}  # flow -> its streaming sources
        self.failure: BaseException | None = None  # the first error inside an apply
        self.causes: dict[str, BaseException] = {}  # each flow's error inside its apply
        self.retries = r.Retries()

        self.qualify = qualifier(project.database)

    def run(self, options: Options) -> None:
        """Run the pipeline once (or until stopped, ``continuous``), logging its events."""
        self.events.write("run_started")
        self.retries = r.Retries.of({k: self.spark.conf.get(k, v) for k, v in r.DEFAULTS.items()})
        try:
            with self.progress:
                self._run(options)
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt) or interrupt.requested():
                # Ctrl-C (or the cancelled job it left): stopped by the user, not failed.
                self.events.write("run_stopped", message=STOPPED)
                raise
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
        if options.replay_from is not None:
            selected.add(self._rewind(options.replay_from, resetting, options))
        for dataset in self.graph.order:
            if dataset.name in resetting:
                self._reset(dataset)
        for dataset in self.graph.order:
            interrupt.check()
            if dataset.kind == "temporary_view":
                self._view(dataset, options)
            elif dataset.name in selected:
                self._update(dataset, options)
        if options.continuous:
            self._keep_running(options)
        for dataset in self.graph.order:  # temporary views live in the pipeline only
            if dataset.kind == "temporary_view":
                self.spark.catalog.dropTempView(dataset.name)

    def _rewind(self, wanted: replay.Replay, resetting: set[str], options: Options) -> str:
        """Rewind the flow ``wanted`` names, before anything is written; its dataset."""
        for view in self.graph.order:
            if view.kind == "temporary_view":
                self._view(view, options)
        dataset = rewind.rewind_flow(
            self.spark, self.project, self.graph, wanted, self.events, self.qualify, resetting
        )
        say(f"flow {wanted.flow}: replaying from {wanted.position}")
        return dataset

    def _view(self, dataset: Dataset, options: Options) -> None:
        for kind in self.graph.of(dataset.name):
            kind.start(self, options)

    def _update(self, dataset: Dataset, options: Options) -> None:
        if dataset.kind == "materialized_view":
            (kind,) = self.graph.of(dataset.name)
            self.events.write("flow_started", flow=kind.name, target=kind.target)
            kind.start(self, options)
            self.events.write("flow_stopped", flow=kind.name, target=kind.target)
            return
        for kind in self.graph.of(dataset.name):
            query = self._started(kind, options)
            if query is None:
                continue
            if options.continuous:
                self.queries.append((kind, query))
            else:
                self.stopped(kind.name, kind.target)
                say(f"flow {kind.name}: up to date")

    def _started(self, kind: Kind, options: Options) -> StreamingQuery | None:
        """Start a flow (a triggered run: and run it to the end), started again after a
        failure that is not autocdc's own while it has attempts left."""
        while True:
            try:
                interrupt.check()
                query = kind.start(self, options)
                if query is not None and not options.continuous:
                    query.awaitTermination()
                    interrupt.check()  # Ctrl-C stopped it, short of up to date
                if not options.continuous:  # a triggered run ends with nothing staged
                    kind.apply_staged(self)
                return query
            except BaseException as error:
                pause = self._failed(kind, error)
                if pause is None:
                    raise
            interrupt.sleep(pause)

    def _failed(self, kind: Kind, error: BaseException) -> float | None:
        """Log a flow's failure: the pause before its next attempt, or None when it has
        none (raise then: the error as it is, or the autocdc error that says more)."""
        cause = self.causes.pop(kind.name, None) or error
        ours = (
            data_lost(cause, kind.name, kind.dataset.name)
            or checkpoint_refused(cause, kind.name, kind.dataset.name, self._folder(kind))
            or raised_in_worker(cause)
        )
        said = ours or cause
        attempt = self.retries.next(kind.name, said)
        if attempt is None:
            self.events.write("error", flow=kind.name, target=kind.target, error=said)
            if ours is not None and ours is not error:
                raise ours from error
            if self.retries.failures.get(kind.name) and r.retryable(said):
                raise FlowRetriesExhaustedError(
                    flow=kind.name,
                    target=kind.target,
                    failures=self.retries.attempts + 1,
                    cause=_first_line(said),
                    attempts=self.retries.attempts,
                ) from error
            return None
        if self.failure is cause:
            self.failure = None  # the run's failure only if the last attempt fails too
        number, pause = attempt
        message = f"attempt {number} of {self.retries.attempts} in {pause:g} s: {said}"
        self.events.write(
            "flow_retry", flow=kind.name, target=kind.target, error=said, message=message
        )
        cause_said = _first_line(said)
        say(f"flow {kind.name}: failed ({cause_said}); {message.split(':')[0]}")
        return pause

    def _folder(self, kind: Kind) -> Path:
        return self.project.checkpoint(kind.name)

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
            for kind in self.graph.of(dataset.name):
                if kind.stages:
                    staging += 1
                    if kind.apply_staged(self) is None:
                        say(f"flow {kind.name}: nothing staged")
        if not staging:
            say("no flow with max_staleness: nothing to apply")

    def missing_inputs(self, dataset: Dataset) -> list[str]:
        """The tables ``dataset`` reads that do not exist yet (temporary views aside)."""
        kinds = {d.name: d.kind for d in self.graph.order}
        return sorted(
            self.qualify(name)
            for name in self.graph.reads.get(dataset.name, set())
            if kinds.get(name) != "temporary_view"
            and not self.spark.catalog.tableExists(self.qualify(name))
        )

    def started(self, flow: str, target: str, df: DataFrame | None) -> None:
        """Log a flow starting (``df``: its streaming source, whose position is logged)."""
        streaming = df is not None and df.isStreaming
        self.sources[flow] = pos.sources(df, self.project.root) if streaming else []
        self.progress.started(flow, self._flow_event("flow_started", flow, target))

    def stopped(self, flow: str, target: str) -> None:
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

    def applied(
        self,
        flow: str,
        target: str,
        metrics: BatchMetrics,
        stream_batch_id: int | None,
        position: list[dict] | None = None,
    ) -> None:
        """Log one applied batch: the event (with the offsets it reached and the lag after
        it, or the ``position`` a batch source gives), the metrics line and the progress.
        A batch with no micro-batch of a streaming source (an apply of staged changes)
        stands where the flow's checkpoint last committed."""
        checkpoint = self.project.checkpoint(flow)
        found = self.sources.get(flow, [])
        at = pos.committed(checkpoint) if stream_batch_id is None else stream_batch_id
        ends = pos.offsets(checkpoint, at)
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
        self.retries.succeeded(flow)
        if is_staged_apply(metrics.as_dict()):  # no micro-batch: its rows were counted staged
            self.progress.staged_applied(flow, metrics.applied_staged, metrics.seconds, lag)
            return
        # The micro-batch as the user sees it (the query's); a batch source's is its commit.
        number = metrics.batch_id if stream_batch_id is None else stream_batch_id
        self.progress.batch(flow, number, metrics.rows_in, metrics.seconds, lag)

    def guarded(
        self, flow: str, apply: Callable[[DataFrame], BatchMetrics], df: DataFrame
    ) -> BatchMetrics:
        """``apply(df)`` for ``flow``, its error kept as the flow's cause and the run's
        failure (Spark wraps it, when raised inside a streaming query's ``foreachBatch``)."""
        try:
            fail_point(f"apply:{flow}")
            return apply(df)
        except BaseException as error:
            self.failure = self.failure or error
            self.causes[flow] = error
            raise

    def triggered(self, writer: DataStreamWriter, flow: str, options: Options) -> DataStreamWriter:
        """A flow's streaming writer, checkpointed in its folder, on the run's trigger."""
        folder = self.project.checkpoint(flow)
        cleared = unstarted.clear(folder, notes=(APPLIED,))
        if cleared:
            said = f"flow {flow}: its first micro-batch never logged (a run was killed as it began)"
            say(f"{said}; starting it afresh")
            message = f"{said}; cleared {', '.join(cleared)}"
            self.events.write("checkpoint_restarted", flow=flow, message=message)
        writer = writer.option("checkpointLocation", str(folder)).queryName(flow)
        if options.continuous:
            return writer.trigger(processingTime=f"{options.trigger_seconds} seconds")
        return writer.trigger(availableNow=True)

    def follow_a_move(self, flow: str, dataset: str, checkpoint: Path) -> None:
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

    def extraction_step(self, flow: str, source: Extraction, dataset: str) -> extraction.Step:
        """One run of an extraction source for ``flow`` (:mod:`extraction`)."""
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

    @staticmethod
    def _log(metrics: BatchMetrics) -> None:
        """The batch's outcome in words (``autocdc history`` has every count)."""
        said = f"{outcome(metrics.as_dict())}; {metrics.seconds:.1f} s"
        say(f"flow {metrics.flow}: {said} (commit {metrics.batch_id})")

    def _reset(self, dataset: Dataset) -> None:
        """Full refresh: drop the dataset's table (with its autocdc state and quarantine)
        and its flows' checkpoints, so the next run reprocesses the sources."""
        target = self.qualify(dataset.name)
        for kind in self.graph.of(dataset.name):
            shutil.rmtree(self.project.checkpoint(kind.name), ignore_errors=True)
            kind.reset(self.spark)
        if self.spark.catalog.tableExists(target):
            location = self.spark.sql(f"DESCRIBE DETAIL {target}").first()["location"]
            self.spark.sql(f"DROP TABLE {target}")
            shutil.rmtree(location.removeprefix("file:"), ignore_errors=True)
        say(f"full refresh of {target}")

    def _keep_running(self, options: Options) -> None:
        """Until Ctrl-C or SIGTERM: streaming queries run on their trigger, materialized
        views are recomputed every interval; a failed flow starts again after its pause
        while the others run; then every query stops cleanly (and Ctrl-C raises
        KeyboardInterrupt)."""
        stop: list[int] = []
        signal.signal(signal.SIGTERM, lambda number, _frame: stop.append(number))
        if not interrupt.active():  # a run not started by the CLI
            signal.signal(signal.SIGINT, lambda number, _frame: stop.append(number))
        interval = options.trigger_seconds
        say(f"running continuously (every {interval:g} s); Ctrl-C stops")
        waiting: dict[int, float] = {}  # a failed flow's query (by index): when it restarts
        while not (stop or interrupt.requested()):
            deadline = time.monotonic() + interval
            while not (stop or interrupt.requested()) and time.monotonic() < deadline:
                for i, (kind, query) in enumerate(self.queries):
                    if i in waiting:
                        if time.monotonic() >= waiting[i]:
                            del waiting[i]
                            self.queries[i] = (kind, self._restart(kind, options, "starting again"))
                        continue
                    error = query.exception()
                    if error is None:
                        continue
                    cause = self.causes.get(kind.name) or error
                    schema = raised_in_worker(cause)
                    if isinstance(schema, DebeziumSchemaChangedError):
                        self.events.write("error", flow=kind.name, target=kind.target, error=schema)
                        self.causes.pop(kind.name, None)
                        self.failure = None
                        said = "its source's events gained columns; starting it again"
                        self.queries[i] = (kind, self._restart(kind, options, said))
                        continue
                    pause = self._failed(kind, error)
                    if pause is None:
                        raise error
                    waiting[i] = time.monotonic() + pause
                time.sleep(0.2)
            for i, (kind, _query) in enumerate(self.queries):
                if i not in waiting and not (stop or interrupt.requested()):
                    kind.apply_staged(self, due_only=True)
            for dataset in self.graph.order:
                if dataset.kind == "materialized_view" and not (stop or interrupt.requested()):
                    for kind in self.graph.of(dataset.name):
                        kind.start(self, options)
        for kind, query in self.queries:
            query.stop()
            self.stopped(kind.name, kind.target)
        interrupt.check()  # Ctrl-C exits 130 here too, as at any other moment
        say("stopped")

    def _restart(self, kind: Kind, options: Options, why: str) -> StreamingQuery:
        """Start a flow's query again over views built again (a Debezium source whose
        events gained a column takes it); the failed micro-batch was not committed to the
        checkpoint, and runs again from there."""
        say(f"flow {kind.name}: {why}")
        for view in self.graph.order:
            if view.kind == "temporary_view":
                self._view(view, options)
        query = kind.start(self, options)
        assert query is not None
        return query
