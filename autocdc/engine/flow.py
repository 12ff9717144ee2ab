"""``AutoCdcFlow``: a declared flow, running; the one place that lists a batch's steps.

apply(batch): fit → prepare the tables → catch up → stage → count → plan (the SCD
strategy) → write (quarantine, redo, target, state) → maintain → metrics. Each step is a
function of its own module; :meth:`AutoCdcFlow._apply_once` reads as that list. The
commit protocol, and why a crash at any point is harmless, is written down in
:mod:`autocdc.engine.commit`. A flow with ``max_staleness`` stages its micro-batches
instead: :class:`~autocdc.engine.staged.StagedFlow` wraps the flow for that.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from autocdc.engine import (
    commit,
    fit,
    gc,
    metrics,
    quarantine,
    scd1,
    scd2,
    stage,
    staged_table,
    tables,
    tuning,
    write,
)
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Counts, Plan, count_sized, merged
from autocdc.engine.errors import ConcurrentWriteError
from autocdc.engine.faults import crash_point
from autocdc.engine.metrics import BatchMetrics, Steps
from autocdc.engine.sequences import hex_sequence, parse_hex_sequence
from autocdc.engine.spec import END_AT, MAX_RETENTION_DAYS, START_AT, FlowDefinition, Running
from autocdc.engine.staged import StagedFlow
from autocdc.engine.tables import col

GC_INTERVAL_SECONDS = 3600.0
MAX_ATTEMPTS = 8  # of one batch against writers that keep committing meanwhile
STRATEGIES = {1: scd1.plan, 2: scd2.plan}
CURRENT_VIEW_SUFFIX = "__autocdc_current"


def _wait_after_losing(since: float) -> None:
    """Wait about as long as the lost attempt took (with jitter): a writer that keeps
    losing to a faster one gets a window, and two that retry together drift apart."""
    time.sleep(random.uniform(0.5, 1.5) * (time.perf_counter() - since))


@dataclass
class Memory:
    """What a flow learnt of its tables between batches. Where the state is and its meta,
    as the flow last committed or read them, and the (target, state) table versions then:
    while both tables are still at those versions, nobody committed since."""

    stored: commit.Stored | None = None
    meta: st.MetaFrame | None = None
    at: tuple[int, int] | None = None
    gc_clock: float | None = None  # since when a long-running process has run the flow
    unmaintained: tuple[st.Layout, st.Meta] | None = None  # a maintenance put off

    def forget(self) -> None:
        self.stored = self.meta = self.at = None


class AutoCdcFlow(Running):
    """A running Auto CDC flow: its :class:`FlowDefinition` (whose fields it reads as
    its own: ``flow.target``, ``flow.keys``) and what it learnt of its tables between
    batches; ``apply`` one micro-batch at a time.

    >>> flow = AutoCdcFlow(target="customers", keys=["id"], sequence_by="seq",
    ...                    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"])
    >>> flow.state_table
    'customers__autocdc_state'
    """

    def __init__(self, definition: FlowDefinition | None = None, /, **fields: Any) -> None:
        if definition is not None and fields:
            raise TypeError("AutoCdcFlow takes a FlowDefinition or its fields, not both")
        self.definition = FlowDefinition(**fields) if definition is None else definition
        self.staged = StagedFlow(self)
        self._memory = Memory()

    @classmethod
    def of(cls, definition: FlowDefinition, **placed: Any) -> AutoCdcFlow:
        """The running flow of ``definition`` (validated when it was declared, not again),
        with what a run decides for it (``placed``: its qualified ``target``, the
        target's ``cluster_by``, ``table_properties``, ``partial_target`` and
        ``snapshot_target``, an extraction read's ``sequence_by``), knowing nothing of its
        tables yet."""
        return cls(definition.model_copy(update=placed))

    @property
    def state_table(self) -> str:
        return self.definition.target + tables.STATE_SUFFIX

    @property
    def quarantine_table(self) -> str:
        return self.definition.target + tables.QUARANTINE_SUFFIX

    @property
    def _names(self) -> commit.Tables:
        return commit.Tables(self.definition.target, self.state_table, self.quarantine_table)

    @property
    def tombstones(self) -> int:
        """The tombstones the state held when this flow last read or wrote it (0: not yet)."""
        return self._memory.meta.meta.tombstones if self._memory.meta is not None else 0

    def committed_batch(self, spark: SparkSession) -> int:
        """The id of the last batch committed to the target (0: none yet)."""
        return commit.committed_version(spark, self.definition.target, self._names.app_id)

    def check(self, df: DataFrame, fresh: bool = False) -> None:
        """Raise what ``apply`` would raise for a batch of ``df``'s schema, writing nothing:
        a runner validates a whole pipeline (a streaming source included) before it runs.
        ``fresh`` checks as for a new target (one a full refresh is about to drop)."""
        stage.check_deterministic(df, self.definition)
        fit.fit(df.sparkSession, self.definition, df, self.state_table, fresh)

    def apply(self, df: DataFrame) -> BatchMetrics:
        """Apply one micro-batch of changes; safe to repeat after a crash.

        Another writer committing to the flow meanwhile makes this batch start over
        against the new state (a few times, then :class:`ConcurrentWriteError`).
        With ``max_staleness`` the micro-batch is staged instead (:meth:`stage`).
        """
        if self.definition.max_staleness is not None:
            return self.staged.stage(df)
        return self.apply_now(df)

    def stage(self, df: DataFrame, stage_id: int | None = None) -> BatchMetrics:
        """Stage one micro-batch: see :meth:`StagedFlow.stage`."""
        return self.staged.stage(df, stage_id)

    def apply_if_due(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply the staged changes if they are due: see :meth:`StagedFlow.apply_if_due`."""
        return self.staged.apply_if_due(spark)

    def apply_staged(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply every change the flow has staged: see :meth:`StagedFlow.apply`."""
        return self.staged.apply(spark)

    def staged_status(self, spark: SparkSession) -> staged_table.Status:
        """What the flow holds staged: batches, rows, the oldest's age, the last apply."""
        return self.staged.status(spark)

    def apply_now(self, df: DataFrame, maintain: bool = True) -> BatchMetrics:
        """Apply ``df`` to the target now, whatever the flow's ``max_staleness``; without
        ``maintain`` the state's maintenance is put off to :meth:`maintain` (an apply of
        staged changes collects tombstones only once those are cleared)."""
        started = time.perf_counter()
        spark = df.sparkSession
        stage.check_deterministic(df, self.definition)
        self._memory.unmaintained = None
        if self._memory.gc_clock is None:
            self._memory.gc_clock = time.monotonic()
        with tuning.engine_settings(spark):
            for _ in range(MAX_ATTEMPTS):
                attempt = time.perf_counter()
                try:
                    return self._apply_once(spark, df, started, maintain)
                except tables.RETRYABLE:
                    self._memory.forget()  # re-read what the winner committed
                    _wait_after_losing(attempt)
                except (PySparkException, Py4JJavaError):
                    stored = self._memory.stored
                    if stored is None or not stored.vanished():
                        raise
                    self._memory.forget()  # another writer folded the state this batch read
        raise ConcurrentWriteError(table=self.definition.target, attempts=MAX_ATTEMPTS)

    def _apply_once(
        self, spark: SparkSession, df: DataFrame, started: float, maintain: bool
    ) -> BatchMetrics:
        spec, steps = self.definition, Steps()
        fitted = fit.fit(spark, spec, df, self.state_table)
        fit.prepare_tables(spark, spec, fitted, self.state_table)
        stored = self._catch_up(spark)
        meta = self._meta_at(spark, fitted.layout, stored)
        steps.lap("prepare")
        changes = stage.stage(
            fit.conformed(df, fitted), spec, fitted.layout.key_names, list(df.columns)
        )
        with commit.warming(spark, [self.state_table, spec.target]):
            try:
                counts = count_sized(df, changes, fitted.layout.keys, meta.meta.rows)
                steps.lap("stage")
                if counts.rows_in == 0:  # nothing to read state for
                    return self._measured(started, stored.committed, counts, steps)
                batch = self._batch(spark, fitted, changes, counts, meta, stored)
                plan = STRATEGIES[spec.stored_as_scd_type](batch)
                steps.lap("plan")
                crash_point("after_stage")
                written = write.planned(batch, plan, steps)
                if written is None:  # nothing recorded: the batch id is not used up
                    return self._measured(started, batch.batch_id - 1, counts, steps, plan)
                self._remember(spark, written)
                collected = self._maintain(spark, batch.layout, written.meta.meta, maintain)
                steps.lap("maintain")
                return self._measured(
                    started, batch.batch_id, counts, steps, plan, written, collected
                )
            finally:
                changes.tagged.unpersist()

    def _measured(
        self,
        started: float,
        batch_id: int,
        counts: Counts,
        steps: Steps,
        plan: Plan | None = None,
        written: write.Written | None = None,
        collected: int = 0,
    ) -> BatchMetrics:
        return metrics.measured(
            self.definition,
            started,
            batch_id,
            counts,
            steps,
            plan,
            merged=None if written is None else written.merged,
            quarantined=0 if written is None else written.quarantined,
            collected=collected,
            tombstones=self.tombstones,
        )

    def _batch(
        self,
        spark: SparkSession,
        fitted: fit.Fit,
        changes: stage.StagedBatch,
        counts: Counts,
        meta: st.MetaFrame,
        stored: commit.Stored,
    ) -> Batch:
        batch = Batch(
            spark=spark,
            spec=self.definition,
            names=self._names,
            layout=fitted.layout,
            tracked=fitted.tracked,
            staged=changes,
            counts=counts,
            meta=meta,
            stored=stored,
            batch_id=stored.committed + 1,
        )
        tuning.fit_to_size(spark, batch.meta.meta.rows + counts.rows_in)
        return batch

    def preview(self, df: DataFrame) -> DataFrame:
        """The target (read at its current version) merged with the changes of ``df``:
        the engine's own plan of them, its MERGE computed at read time, nothing written."""
        spark, spec = df.sparkSession, self.definition
        fitted = fit.fit(spark, spec, df, self.state_table)
        fit.prepare_tables(spark, spec, fitted, self.state_table)  # a no-op once staged
        stored = self._catch_up(spark)
        meta = self._meta_at(spark, fitted.layout, stored)
        version = commit.table_version(spark, spec.target)
        location = tables.default_location(spark, spec.target)
        target = spark.read.format("delta").option("versionAsOf", version).load(location)
        changes = stage.stage(fit.conformed(df, fitted), spec, fitted.layout.key_names, df.columns)
        try:
            counts = count_sized(df, changes, fitted.layout.keys, meta.meta.rows)
            if counts.rows_in == 0:
                return target
            batch = self._batch(spark, fitted, changes, counts, meta, stored)
            return merged(target, STRATEGIES[spec.stored_as_scd_type](batch))
        finally:
            changes.tagged.unpersist()

    def _catch_up(self, spark: SparkSession) -> commit.Stored:
        """The committed batches and where their state is: as this flow left them while
        nobody committed since, else looked up (and the meta read again)."""
        memory = self._memory
        if memory.stored is not None and self._versions(spark) == memory.at:
            return memory.stored
        memory.meta = None
        memory.stored = commit.catch_up(
            spark, self._names, lambda: quarantine.create(spark, self.quarantine_table)
        )
        memory.at = self._versions(spark)
        return memory.stored

    def _versions(self, spark: SparkSession) -> tuple[int, int]:
        return (
            commit.table_version(spark, self.definition.target),
            commit.table_version(spark, self.state_table),
        )

    def _meta_at(
        self, spark: SparkSession, layout: st.Layout, stored: commit.Stored
    ) -> st.MetaFrame:
        """The state's meta: the one this flow committed last, unless another writer (or
        a compaction) committed since; else read (one small job)."""
        if self._memory.meta is None:
            self._memory.meta = st.read_meta(spark, stored.read(spark, layout.schema()), layout)
        return self._memory.meta

    def _remember(self, spark: SparkSession, written: write.Written) -> None:
        """What this batch committed is what the flow knows until someone else commits."""
        self._memory.meta, self._memory.stored = written.meta, written.stored
        self._memory.at = self._versions(spark)

    def _maintain(self, spark: SparkSession, layout: st.Layout, meta: st.Meta, now: bool) -> int:
        """Compact the state (collecting old tombstones) when superseded rows outnumber
        current ones, or hourly in a long-running process while tombstones are held;
        not ``now``: put off until :meth:`maintain`."""
        if not now:
            self._memory.unmaintained = (layout, meta)
            return 0
        if self.definition.stored_as_scd_type == 2:
            return 0
        clock = self._memory.gc_clock
        hourly = clock is not None and (
            time.monotonic() - clock > GC_INTERVAL_SECONDS and meta.tombstones > 0
        )
        if not (hourly or gc.compaction_due(meta)):
            return 0
        try:  # another writer moved on meanwhile: a later batch compacts
            return self._collect(spark, layout)
        except tables.RETRYABLE:
            return 0

    def maintain(self, spark: SparkSession) -> int:
        """The maintenance an ``apply_now(df, maintain=False)`` put off; the tombstones
        it collected (0: none, or nothing was put off)."""
        if self._memory.unmaintained is None:
            return 0
        layout, meta = self._memory.unmaintained
        self._memory.unmaintained = None
        with tuning.engine_settings(spark):
            return self._maintain(spark, layout, meta, now=True)

    def current(self, spark: SparkSession) -> DataFrame:
        """The live rows only: for type 2, each key's open version (``__END_AT`` NULL).

        With ``max_staleness``, the target merged with every change staged so far: the
        rows the target will hold once they are applied (a snapshot: staged changes and
        target as they are now)."""
        target = self.fresh(spark)
        if self.definition.stored_as_scd_type == 1:
            return target
        return target.where(col(END_AT).isNull()).drop(START_AT, END_AT)

    def fresh(self, spark: SparkSession) -> DataFrame:
        """The whole target (type 2: every version), merged with the staged changes of a
        flow with ``max_staleness``; else the target as it is."""
        if self.definition.max_staleness is None:
            return tables.read(spark, self.definition.target)
        return self.staged.fresh(spark)

    def current_view(self, spark: SparkSession, name: str | None = None) -> str:
        """Register :meth:`current` as a temporary view (default ``<table>__autocdc_current``)
        for Spark SQL, and return its name; it shows the rows as of this call: register
        it again to see later changes."""
        view = name or self.definition.target.rpartition(".")[2] + CURRENT_VIEW_SUFFIX
        self.current(spark).createOrReplaceTempView(view)
        return view

    def as_of(self, spark: SparkSession, sequence: object) -> DataFrame:
        """Type 2: the rows as they were at ``sequence`` (a value or a Column of the
        sequence's type), i.e. the versions with ``__START_AT <= sequence < __END_AT``.

        With no ``sequence_by`` the validity columns hold ``_CHANGE_SEQUENCE_NUMBER`` as
        :func:`autocdc.hex_sequence` does (four numeric sections), and ``sequence`` may be
        the text itself: ``flow.as_of(spark, "16/B374D848")``."""
        if self.definition.sequence_by is None and isinstance(sequence, str):
            parse_hex_sequence(sequence)  # a malformed value is an error, not an empty result
            sequence = hex_sequence(F.lit(sequence))
        at = sequence if isinstance(sequence, Column) else F.lit(sequence)
        target = self.fresh(spark)
        alive = (col(START_AT) <= at) & (col(END_AT).isNull() | (col(END_AT) > at))
        return target.where(alive).drop(START_AT, END_AT)

    def collect_tombstones(self, spark: SparkSession) -> int:
        """Compact the state table and collect tombstones older than
        ``tombstone_retention_days`` now; returns how many were collected.

        ``apply`` also does this whenever superseded state rows outnumber current ones,
        and hourly in a long-running process; call it from a maintenance job to control
        when the state table is rewritten. SCD type 2 keeps its whole change log (deletes
        are history): nothing is collected, and nothing is rewritten.
        """
        spec = self.definition
        if (
            spec.stored_as_scd_type == 2
            or spec.sequence_groups is not None
            or not tables.exists(spark, self.state_table)
        ):
            return 0
        if spec.max_staleness is not None:  # collected against an applied target only
            self.staged.apply(spark)
        layout = fit.stored_layout(spark, spec, self.state_table)
        with tuning.engine_settings(spark):
            for _ in range(MAX_ATTEMPTS):
                attempt = time.perf_counter()
                try:
                    return self._collect(spark, layout)
                except tables.RETRYABLE:
                    _wait_after_losing(attempt)
        raise ConcurrentWriteError(table=self.state_table, attempts=MAX_ATTEMPTS)

    def _collect(self, spark: SparkSession, layout: st.Layout) -> int:
        self._memory.gc_clock = time.monotonic()
        commit.fold(spark, self._catch_up(spark), layout.schema())  # compact it all
        # With sequence groups nothing is collected (compacted only): a group's tombstone
        # is all that keeps its older upserts out, and there is no horizon per group.
        retention = (
            MAX_RETENTION_DAYS if layout.grouped else self.definition.tombstone_retention_days
        )
        collected = gc.compact(spark, self.state_table, layout, retention)
        self._memory.forget()
        return collected

    def full_refresh(self, spark: SparkSession) -> None:
        """Drop the target, its state and its quarantine: the next ``apply`` starts over.

        The way to change what the state depends on (keys, the sequence's type, the SCD
        type, whether the target is partial): replay the source from the start afterwards.
        """
        for table in (self.definition.target, self.state_table, self.quarantine_table):
            tables.drop(spark, table)
        staged_table.drop(spark, self.definition.target)
        commit.drop_redo(spark, self._names)
        self._memory = Memory()
        self.staged.forget()
