"""Run a resolved pipeline: each dataset in dependency order.

A streaming table's flows run as Structured Streaming queries, checkpointed under the
project's ``storage`` (one folder per flow); an AUTO CDC flow hands each micro-batch to
``AutoCdcFlow.apply`` in ``foreachBatch``. Materialized views are recomputed after their
inputs, temporary views are defined in order. By default every query processes what is
available and stops (``availableNow``); ``continuous`` keeps them running.

Exactly once: Spark replays a micro-batch whose commit it did not record, with the same
id and the same input. The id of the last batch applied is kept beside the checkpoint,
so a replay is skipped; a crash between the apply and that note replays the batch into
the engine, where a repeated change is a no-op by design.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from autocdc import AutoCdcFlow
from autocdc.pipelines import graph as g
from autocdc.pipelines.errors import UnknownDatasetError
from autocdc.pipelines.project import Project
from autocdc.pipelines.registry import CdcFlow, Dataset, Flow, QueryFlow

APPLIED = "autocdc-applied-batch"


@dataclass
class Options:
    full_refresh: set[str] = field(default_factory=set)
    full_refresh_all: bool = False
    refresh: set[str] | None = None  # None: every dataset
    continuous: bool = False
    trigger_seconds: float = 10.0

    def resets(self, name: str) -> bool:
        """Whether dataset ``name`` is dropped by a full refresh before it runs."""
        return self.full_refresh_all or name in self.full_refresh


def qualifier(database: str | None) -> Callable[[str], str]:
    """Dataset name -> table name: unqualified names live in the spec's database."""
    return lambda name: f"{database}.{name}" if database and "." not in name else name


def say(message: str) -> None:
    print(f"autocdc: {message}", flush=True)


@contextlib.contextmanager
def _conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """A flow's own ``spark_conf`` while its query is built and started."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class Runner:
    def __init__(self, spark: SparkSession, project: Project, graph: g.Graph) -> None:
        self.spark = spark
        self.project = project
        self.graph = graph
        self.queries: list[StreamingQuery] = []

        self.qualify = qualifier(project.database)

    def run(self, options: Options) -> None:
        names = [d.name for d in self.graph.order if d.kind != "temporary_view"]
        unknown = (options.full_refresh | (options.refresh or set())) - set(names)
        if unknown:
            raise UnknownDatasetError(names=sorted(unknown), known=names)
        resetting = {name for name in names if options.resets(name)}
        selected = set(names) if options.refresh is None else options.refresh | resetting
        for dataset in self.graph.order:
            if dataset.name in resetting:
                self._reset(dataset)
        for dataset in self.graph.order:
            if dataset.kind == "temporary_view":
                for flow in self.graph.flows[dataset.name]:
                    assert isinstance(flow, QueryFlow)
                    with _conf(self.spark, flow.spark_conf):
                        flow.query().createOrReplaceTempView(dataset.name)
            elif dataset.name in selected:
                self._update(dataset, options)
        if options.continuous:
            self._keep_running(options)
        for dataset in self.graph.order:  # temporary views live in the pipeline only
            if dataset.kind == "temporary_view":
                self.spark.catalog.dropTempView(dataset.name)

    def _update(self, dataset: Dataset, options: Options) -> None:
        target = self.qualify(dataset.name)
        if dataset.kind == "materialized_view":
            (flow,) = self.graph.flows[dataset.name]
            assert isinstance(flow, QueryFlow)
            with _conf(self.spark, flow.spark_conf):
                df = flow.query()
                df.write.format("delta").mode("overwrite").option(
                    "overwriteSchema", "true"
                ).saveAsTable(target)
            say(f"materialized view {target}: {self.spark.table(target).count()} rows")
            return
        for flow in self.graph.flows[dataset.name]:
            query = self._start(flow, dataset, target, options)
            if query is None:
                continue
            if options.continuous:
                self.queries.append(query)
            else:
                query.awaitTermination()
                say(f"flow {flow.name}: up to date")

    def _start(
        self, flow: Flow, dataset: Dataset, target: str, options: Options
    ) -> StreamingQuery | None:
        checkpoint = self.project.checkpoint(flow.name)
        with _conf(self.spark, getattr(flow, "spark_conf", {})):
            df = g.build(flow, dataset, self.spark, target)
            if isinstance(flow, CdcFlow):
                engine = g.engine_flow(flow, target)
                if not df.isStreaming:  # a batch source: the whole table is one batch
                    self._log(engine.apply(df))
                    return None
                writer = df.writeStream.foreachBatch(self._applier(engine, checkpoint))
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

    def _applier(self, engine: AutoCdcFlow, checkpoint: Path):
        note = checkpoint / APPLIED

        def apply(batch: DataFrame, batch_id: int) -> None:
            if note.is_file() and int(note.read_text()) >= batch_id:
                say(f"flow {engine.name or engine.target}: batch {batch_id} already applied")
                return
            self._log(engine.apply(batch))
            partial = note.with_suffix(".tmp")
            partial.write_text(str(batch_id))
            partial.replace(note)

        return apply

    @staticmethod
    def _log(metrics: object) -> None:
        values = metrics.as_dict()  # type: ignore[attr-defined]
        flow = values.pop("flow")
        say(f"flow {flow}: " + " ".join(f"{k}={v}" for k, v in values.items()))

    def _reset(self, dataset: Dataset) -> None:
        """Full refresh: drop the dataset's table (with its autocdc state and quarantine)
        and its flows' checkpoints, so the next run reprocesses the sources."""
        target = self.qualify(dataset.name)
        for flow in self.graph.flows[dataset.name]:
            shutil.rmtree(self.project.checkpoint(flow.name), ignore_errors=True)
            if isinstance(flow, CdcFlow):
                g.engine_flow(flow, target).full_refresh(self.spark)
        if self.spark.catalog.tableExists(target):
            location = self.spark.sql(f"DESCRIBE DETAIL {target}").first()["location"]
            self.spark.sql(f"DROP TABLE {target}")
            shutil.rmtree(location.removeprefix("file:"), ignore_errors=True)
        say(f"full refresh of {target}")

    def _keep_running(self, options: Options) -> None:
        """Until Ctrl-C or SIGTERM: streaming queries run on their trigger, materialized
        views are recomputed every interval; then every query stops cleanly."""
        stop: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda number, _frame: stop.append(number))
        interval = options.trigger_seconds
        say(f"running continuously (every {interval:g} s); Ctrl-C stops")
        while not stop:
            deadline = time.monotonic() + interval
            while not stop and time.monotonic() < deadline:
                for query in self.queries:
                    if query.exception() is not None:
                        raise query.exception()  # type: ignore[misc]
                time.sleep(0.2)
            for dataset in self.graph.order:
                if dataset.kind == "materialized_view" and not stop:
                    self._update(dataset, Options())
        for query in self.queries:
            query.stop()
        say("stopped")
