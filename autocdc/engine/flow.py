"""``AutoCdcFlow``: the declared flow plus the one place that chains the steps.

apply(batch): fit → catch up → stage → plan (SCD strategy) → quarantine → commit
(redo, target, quarantine; the state folded every few batches) → maintain → metrics.
Each step is a function of its own module; the commit protocol, and why a crash at any
point is harmless, is written down in :mod:`autocdc.engine.commit`.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

from py4j.protocol import Py4JJavaError
from pydantic import PrivateAttr
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from autocdc.engine import (
    bound,
    change_rows,
    commit,
    fit,
    gc,
    quarantine,
    scd1,
    scd2,
    stage,
    staged,
    tables,
    tuning,
)
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Counts, Plan, merged
from autocdc.engine.errors import ConcurrentWriteError, MaxStalenessUnsupportedError
from autocdc.engine.faults import crash_point
from autocdc.engine.metrics import BatchMetrics, Steps
from autocdc.engine.sequences import hex_sequence, parse_hex_sequence
from autocdc.engine.spec import END_AT, MAX_RETENTION_DAYS, START_AT, FlowDefinition
from autocdc.engine.stage import DELETE, OP, REASON, TRUNCATE, col

GC_INTERVAL_SECONDS = 3600.0
MAX_ATTEMPTS = 8  # of one batch against writers that keep committing meanwhile
STRATEGIES = {1: scd1.plan, 2: scd2.plan}
CURRENT_VIEW_SUFFIX = "__autocdc_current"


def _wait_after_losing(since: float) -> None:
    """Wait about as long as the lost attempt took (with jitter): a writer that keeps
    losing to a faster one gets a window, and two that retry together drift apart."""
    time.sleep(random.uniform(0.5, 1.5) * (time.perf_counter() - since))


class AutoCdcFlow(FlowDefinition):
    """A running Auto CDC flow: its definition plus what it learnt of its tables between
    batches; ``apply`` one micro-batch at a time.

    >>> flow = AutoCdcFlow(target="customers", keys=["id"], sequence_by="seq",
    ...                    apply_as_deletes="op = 'D'", except_column_list=["op", "seq"])
    >>> flow.state_table
    'customers__autocdc_state'
    """

    # Where the state is and its meta, as this flow last committed or read them, and the
    # (target, state) table versions then: while both tables are still at those
    # versions, nobody committed since.
    _stored: commit.Stored | None = PrivateAttr(default=None)
    _meta: st.MetaFrame | None = PrivateAttr(default=None)
    _at: tuple[int, int] | None = PrivateAttr(default=None)
    _gc_clock: float | None = PrivateAttr(default=None)
    # An apply of staged changes collects tombstones only once they are cleared.
    _defer_maintenance: bool = PrivateAttr(default=False)
    _deferred: tuple[st.Layout, st.Meta] | None = PrivateAttr(default=None)
    # What this flow last knew to be staged, and at which version of the staging table.
    _known: staged.Known | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, definition: FlowDefinition, **placed: Any) -> AutoCdcFlow:
        """The running flow of ``definition`` (validated when it was declared, not again),
        with what a run decides for it (``placed``: its qualified ``target``, the
        target's ``cluster_by``, ``table_properties``, ``partial_target`` and
        ``snapshot_target``, an extraction read's ``sequence_by``), knowing nothing of its
        tables yet."""
        fields = {name: getattr(definition, name) for name in FlowDefinition.model_fields}
        return cls.model_construct(
            _fields_set=definition.model_fields_set | set(placed), **{**fields, **placed}
        )

    @property
    def state_table(self) -> str:
        return self.target + tables.STATE_SUFFIX

    @property
    def quarantine_table(self) -> str:
        return self.target + tables.QUARANTINE_SUFFIX

    @property
    def _names(self) -> commit.Tables:
        return commit.Tables(self.target, self.state_table, self.quarantine_table)

    def _prepare_tables(self, spark: SparkSession, fitted: fit.Fit) -> None:
        """Create the tables on the first batch (target first: the state table's existence
        means both exist), or evolve them to the batch's columns."""
        target_fields = list(fitted.target_columns)
        if self.stored_as_scd_type == 2:
            seq = fitted.layout.sequence
            target_fields += [StructField(START_AT, seq), StructField(END_AT, seq)]
        if fitted.creating:
            tables.create(
                spark,
                self.target,
                StructType(target_fields),
                self.table_properties,
                self.cluster_by,
            )
            crash_point("after_target_create")
            st.create(
                spark,
                self.state_table,
                fitted.layout,
                fit.definition(self, fitted.layout.sequence),
            )
        elif fitted.evolving:
            tables.evolve(spark, self.target, target_fields, before=START_AT)
            tables.evolve(spark, self.state_table, fitted.layout.schema().fields, before=None)

    def committed_batch(self, spark: SparkSession) -> int:
        """The id of the last batch committed to the target (0: none yet)."""
        return commit.committed_version(spark, self.target, self._names.app_id)

    def check(self, df: DataFrame, fresh: bool = False) -> None:
        """Raise what ``apply`` would raise for a batch of ``df``'s schema, writing nothing:
        a runner validates a whole pipeline (a streaming source included) before it runs.
        ``fresh`` checks as for a new target (one a full refresh is about to drop)."""
        stage.check_deterministic(df, self)
        fit.fit(df.sparkSession, self, df, self.state_table, fresh)

    def apply(self, df: DataFrame) -> BatchMetrics:
        """Apply one micro-batch of changes; safe to repeat after a crash.

        Another writer committing to the flow meanwhile makes this batch start over
        against the new state (a few times, then :class:`ConcurrentWriteError`).
        With ``max_staleness`` the micro-batch is staged instead (:meth:`stage`).
        """
        if self.max_staleness is not None:
            return self.stage(df)
        return self._apply_now(df)

    def stage(self, df: DataFrame, stage_id: int | None = None) -> BatchMetrics:
        """Stage one micro-batch (a flow with ``max_staleness``): its bad rows are
        quarantined, the rest appended to the staging table, nothing else is read or
        written; then the staged changes are applied if they are due (the oldest older
        than ``max_staleness``, or ``max_staged_rows`` staged).

        ``stage_id`` (increasing, e.g. a streaming batch id) makes a replay stage nothing
        twice; without it each call takes the next id. The returned metrics are the
        stage's, or the apply's when it ran, with the staged counts after it."""
        started = time.perf_counter()
        spark = df.sparkSession
        stage.check_deterministic(df, self)
        with tuning.engine_settings(spark):
            metrics = self._stage_once(spark, df, stage_id, started)
        pending = self._pending(spark)
        applied = self.apply_staged(spark) if self._due(pending) else None
        if applied is None:
            return replace(
                metrics,
                staged_batches=pending.batches,
                staged_rows=pending.rows,
                oldest_staged_seconds=pending.age_seconds,
                seconds=round(time.perf_counter() - started, 3),
            )
        return replace(
            applied,
            rows_in=metrics.rows_in,
            skipped=metrics.skipped,
            quarantined=metrics.quarantined + applied.quarantined,
            stage_id=metrics.stage_id,
            rows_staged=metrics.rows_staged,
            steps={**metrics.steps, **{f"apply.{k}": v for k, v in applied.steps.items()}},
            seconds=round(time.perf_counter() - started, 3),
        )

    def _stage_once(
        self, spark: SparkSession, df: DataFrame, stage_id: int | None, started: float
    ) -> BatchMetrics:
        """Quarantine the bad rows, then append the rest to the staging table, the stage's
        commit point: with the pair (the flow's staging app id, the stage id), so Delta
        skips a replayed stage id. The quarantine is idempotent by content (a row already
        there is not added again), so a replay after a crash between the two adds nothing,
        and a different batch that takes the same stage id loses none of its rows."""
        steps = Steps()
        done = staged.last_stage(spark, self.target, self.flow_name)
        stage_id = done + 1 if stage_id is None else stage_id
        committed = self.committed_batch(spark)
        if stage_id <= done:  # a replay of a staged micro-batch
            counts = Counts(0, 0, 0, 0, 0, 0, bound.KeyBound(()))
            nothing = Plan(spark.range(0), None, None)
            return replace(
                self._metrics(started, committed, counts, nothing, {}, steps), stage_id=stage_id
            )
        fitted = fit.fit(spark, self, df, self.state_table)
        if fitted.layout.partial:
            raise MaxStalenessUnsupportedError(
                flow=self.flow_name, why=f"target `{self.target}`, created partial"
            )
        self._prepare_tables(spark, fitted)
        layout = fitted.layout
        steps.lap("prepare")
        shaped = conformed(df, fitted)
        batch = stage.stage(shaped, self, layout.key_names, list(df.columns))
        try:
            counts = _counts(batch, layout.keys, False)
            steps.lap("stage")
            quarantined = rows_staged = 0
            if counts.rejected:
                rejected = quarantine.rows(
                    batch.rejected, batch.source_columns, self.flow_name, stage_id
                )
                quarantine.create(spark, self.quarantine_table)
                quarantine.append(spark, self.quarantine_table, rejected)
                quarantined = counts.rejected
            steps.lap("quarantine")
            if counts.rows_in > counts.rejected:
                kept = [c for c in shaped.columns if c != change_rows.NO_CHANGE]
                good = batch.tagged.where(col(REASON).isNull()).select(*[col(c) for c in kept])
                before, staged_at = staged.version(spark, self.target), time.time()
                known = self._known if self._known and self._known.at == before else None
                crash_point("before_staged_commit")
                appended = staged.append(
                    spark,
                    self.target,
                    self.flow_name,
                    stage_id,
                    staged.tagged(good, self.flow_name, stage_id),
                )
                crash_point("after_staged_commit")
                rows_staged = counts.rows_in - counts.rejected if appended else 0
                self._known = None  # read again, unless only this stage committed since
                after = staged.version(spark, self.target)
                if appended and known is not None and after == max(before, 0) + 1:
                    good_rows = counts.rows_in - counts.rejected
                    self._known = staged.Known(after, known.after_stage(good_rows, staged_at))
            steps.lap("staged")
        finally:
            batch.tagged.unpersist()
        nothing = Plan(spark.range(0), None, None)
        metrics = self._metrics(started, committed, counts, nothing, {}, steps, quarantined)
        return replace(metrics, stage_id=stage_id, rows_staged=rows_staged)

    def _due(self, pending: staged.Status) -> bool:
        """Whether the staged changes are to be applied: the oldest is older than
        ``max_staleness``, or ``max_staged_rows`` are staged."""
        if not pending.rows or self.max_staleness is None:
            return False
        return (pending.age_seconds or 0.0) >= self.max_staleness.total_seconds() or (
            self.max_staged_rows is not None and pending.rows >= self.max_staged_rows
        )

    def apply_if_due(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply the staged changes if they are due (see :meth:`stage`); None if not: what
        a long-running process calls between micro-batches, when a source is quiet."""
        return self.apply_staged(spark) if self._due(self._pending(spark)) else None

    def _pending(self, spark: SparkSession) -> staged.Status:
        """What the flow holds staged: as it last knew while the staging table is at the
        version it knew it at (its own stage the last commit), else read (one job)."""
        at = staged.version(spark, self.target)
        if self._known is None or self._known.at != at:
            status = staged.status(spark, self.target, self.flow_name, last_apply=False)
            self._known = staged.Known(at, status)
        return self._known.status

    def apply_staged(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply every change the flow has staged, as one batch; None when nothing is
        staged. Safe to repeat after a crash (an apply killed after its commit is applied
        again next time: a replay, which changes nothing)."""
        read = staged.read(spark, self.target, self.flow_name)
        if read.rows is None:
            return None
        self._deferred = None
        self._defer_maintenance = True
        try:
            metrics = self._apply_now(read.rows)
        finally:
            self._defer_maintenance = False
        crash_point("after_staged_apply")
        staged.clear(spark, self.target, self.flow_name, read.upto)
        collected = 0
        if self._deferred is not None:  # tombstones collected once nothing is staged
            with tuning.engine_settings(spark):
                collected = self._maintain(spark, *self._deferred)
            self._deferred = None
        pending = self._pending(spark)
        return replace(
            metrics,
            tombstones_collected=collected,
            tombstones_live=metrics.tombstones_live - collected,
            applied_staged=read.count,
            staged_batches=pending.batches,
            staged_rows=pending.rows,
            oldest_staged_seconds=pending.age_seconds,
        )

    def staged_status(self, spark: SparkSession) -> staged.Status:
        """What the flow holds staged: batches, rows, the oldest's age, the last apply."""
        return staged.status(spark, self.target, self.flow_name)

    def _apply_now(self, df: DataFrame) -> BatchMetrics:
        started = time.perf_counter()
        spark = df.sparkSession
        stage.check_deterministic(df, self)
        if self._gc_clock is None:
            self._gc_clock = time.monotonic()
        with tuning.engine_settings(spark):
            for _ in range(MAX_ATTEMPTS):
                attempt = time.perf_counter()
                try:
                    return self._apply_once(spark, df, started)
                except tables.RETRYABLE:
                    self._forget()  # re-read what the winner committed
                    _wait_after_losing(attempt)
                except (PySparkException, Py4JJavaError):
                    if self._stored is None or not self._stored.vanished():
                        raise
                    self._forget()  # another writer folded the state this batch read
        raise ConcurrentWriteError(table=self.target, attempts=MAX_ATTEMPTS)

    def _apply_once(self, spark: SparkSession, df: DataFrame, started: float) -> BatchMetrics:
        steps = Steps()
        fitted = fit.fit(spark, self, df, self.state_table)
        self._prepare_tables(spark, fitted)
        layout, names = fitted.layout, self._names
        stored = self._catch_up(spark)
        meta = self._meta_at(spark, layout, stored)
        steps.lap("prepare")
        staged = stage.stage(conformed(df, fitted), self, layout.key_names, list(df.columns))
        with commit.warming(spark, [names.state, self.target]):
            try:
                counts = self._count(spark, df, staged, layout, meta)
                steps.lap("stage")
                if counts.rows_in == 0:  # nothing to read state for
                    return self._metrics(
                        started,
                        stored.committed,
                        counts,
                        Plan(spark.range(0), None, None),
                        {},
                        steps,
                    )
                batch = self._batch(spark, fitted, staged, counts, meta, stored)
                plan = STRATEGIES[self.stored_as_scd_type](batch)
                steps.lap("plan")
                crash_point("after_stage")
                return self._commit(batch, plan, started, steps)
            finally:
                staged.tagged.unpersist()

    def _count(
        self,
        spark: SparkSession,
        df: DataFrame,
        staged: stage.StagedBatch,
        layout: st.Layout,
        meta: st.MetaFrame,
    ) -> Counts:
        source_bytes = tuning.estimated_bytes(df)
        listed = source_bytes is not None and source_bytes < bound.LISTED_BELOW_BYTES
        with tuning.staging(spark, meta.meta.rows, source_bytes):
            return _counts(staged, layout.keys, listed)

    def _batch(
        self,
        spark: SparkSession,
        fitted: fit.Fit,
        staged: stage.StagedBatch,
        counts: Counts,
        meta: st.MetaFrame,
        stored: commit.Stored,
    ) -> Batch:
        batch = Batch(
            spark=spark,
            spec=self,
            names=self._names,
            layout=fitted.layout,
            tracked=fitted.tracked,
            staged=staged,
            counts=counts,
            meta=meta,
            stored=stored,
            batch_id=stored.committed + 1,
        )
        tuning.fit_to_size(spark, batch.meta.meta.rows + counts.rows_in)
        return batch

    def _merged(self, spark: SparkSession, df: DataFrame) -> DataFrame:
        """The target (read at its current version) merged with the changes of ``df``:
        the engine's own plan of them, its MERGE computed at read time, nothing written."""
        fitted = fit.fit(spark, self, df, self.state_table)
        self._prepare_tables(spark, fitted)  # a no-op: staging created and evolved them
        stored = self._catch_up(spark)
        meta = self._meta_at(spark, fitted.layout, stored)
        version = commit.table_version(spark, self.target)
        location = tables.default_location(spark, self.target)
        target = spark.read.format("delta").option("versionAsOf", version).load(location)
        changes = stage.stage(conformed(df, fitted), self, fitted.layout.key_names, df.columns)
        try:
            counts = self._count(spark, df, changes, fitted.layout, meta)
            if counts.rows_in == 0:
                return target
            batch = self._batch(spark, fitted, changes, counts, meta, stored)
            return merged(target, STRATEGIES[self.stored_as_scd_type](batch))
        finally:
            changes.tagged.unpersist()

    def _catch_up(self, spark: SparkSession) -> commit.Stored:
        """The committed batches and where their state is: as this flow left them while
        nobody committed since, else looked up (and the meta read again)."""
        if self._stored is not None and self._versions(spark) == self._at:
            return self._stored
        self._meta = None
        self._stored = commit.catch_up(
            spark, self._names, lambda: quarantine.create(spark, self.quarantine_table)
        )
        self._at = self._versions(spark)
        return self._stored

    def _forget(self) -> None:
        self._stored = self._meta = self._at = None

    def _versions(self, spark: SparkSession) -> tuple[int, int]:
        return (
            commit.table_version(spark, self.target),
            commit.table_version(spark, self.state_table),
        )

    def _meta_at(
        self, spark: SparkSession, layout: st.Layout, stored: commit.Stored
    ) -> st.MetaFrame:
        """The state's meta: the one this flow committed last, unless another writer (or
        a compaction) committed since; else read (one small job)."""
        if self._meta is None:
            self._meta = st.read_meta(spark, stored.read(spark, layout.schema()), layout)
        return self._meta

    def _commit(self, batch: Batch, plan: Plan, started: float, steps: Steps) -> BatchMetrics:
        spark, staged, names = batch.spark, batch.staged, batch.names
        rejected = staged.rejected if batch.counts.rejected else None
        if plan.late is not None:
            rejected = plan.late if rejected is None else rejected.unionByName(plan.late)
        q_rows = None
        if rejected is not None:
            shaped = quarantine.rows(
                rejected, staged.source_columns, self.flow_name, batch.batch_id
            )
            q_rows = quarantine.new_rows(spark, names.quarantine, shaped).localCheckpoint()
            if q_rows.isEmpty():
                q_rows = None
        steps.lap("quarantine")
        if not plan.changes_anything and q_rows is None:
            # Nothing to record (e.g. a replay): no commit, the batch id is not used up.
            return self._metrics(started, batch.batch_id - 1, batch.counts, plan, {}, steps)
        meta = batch.meta.meta
        grown = st.Meta(
            batch.batch_id,
            meta.tombstones + plan.stats.get("tombstone_delta", 0),
            meta.rows + plan.stats.get("changed", 0),
            meta.keys + plan.stats.get("new_keys", 0),
        )
        horizons = batch.meta.horizons if plan.horizons is None else plan.horizons
        rows = plan.state_rows.unionByName(st.meta_row(horizons, grown, batch.layout))
        redo = commit.write_redo(spark, names, batch.batch_id, rows, q_rows)
        steps.lap("redo")
        merged = commit.commit_target(spark, names, redo, plan.merge, plan.load)
        steps.lap("merge")
        crash_point("after_target_commit")
        commit.apply_quarantine(
            spark, names, redo, lambda: quarantine.create(spark, names.quarantine)
        )
        crash_point("after_quarantine")
        stored = batch.stored.after(redo)
        if stored.fold_due():
            stored = commit.fold(spark, stored, batch.layout.schema())
        crash_point("after_state_commit")
        steps.lap("state")
        self._meta = st.MetaFrame(grown, horizons, batch.meta.empty and plan.horizons is None)
        self._stored, self._at = stored, self._versions(spark)
        if self._defer_maintenance:  # an apply of staged changes: after they are cleared
            collected, self._deferred = 0, (batch.layout, grown)
        else:
            collected = self._maintain(spark, batch.layout, grown)
        steps.lap("maintain")
        quarantined = 0 if q_rows is None else batch.counts.rejected + plan.stats.get("late", 0)
        return self._metrics(
            started,
            batch.batch_id,
            batch.counts,
            plan,
            merged,
            steps,
            quarantined,
            collected,
            grown.tombstones,
        )

    def _maintain(self, spark: SparkSession, layout: st.Layout, meta: st.Meta) -> int:
        """Compact the state (collecting old tombstones) when superseded rows outnumber
        current ones, or hourly in a long-running process while tombstones are held."""
        if self.stored_as_scd_type == 2:
            return 0
        hourly = self._gc_clock is not None and (
            time.monotonic() - self._gc_clock > GC_INTERVAL_SECONDS and meta.tombstones > 0
        )
        if not (hourly or gc.compaction_due(meta)):
            return 0
        try:  # another writer moved on meanwhile: a later batch compacts
            return self._collect(spark, layout)
        except tables.RETRYABLE:
            return 0

    def _metrics(
        self,
        started: float,
        batch_id: int,
        counts: Counts,
        plan: Plan,
        merged: dict[str, int],
        steps: Steps,
        quarantined: int = 0,
        collected: int = 0,
        tombstones: int | None = None,
    ) -> BatchMetrics:
        stats = plan.stats
        if self.stored_as_scd_type == 1:
            if plan.load is not None:  # appended: every action inserts
                upserted = stats["actions"]
            else:
                upserted = merged.get("num_inserted_rows", 0) + merged.get("num_updated_rows", 0)
            deleted = merged.get("num_deleted_rows", 0)
        else:
            upserted, deleted = stats.get("upserted", 0), stats.get("deleted", 0)
        if tombstones is None:
            tombstones = self._meta.meta.tombstones if self._meta is not None else 0
        return BatchMetrics(
            flow=self.flow_name,
            batch_id=batch_id,
            rows_in=counts.rows_in,
            skipped=counts.skipped,
            upserted=upserted,
            deleted=deleted,
            ignored_stale=stats.get("stale", 0),
            duplicates_dropped=counts.keyed - stats.get("distinct", counts.keyed),
            conflicts=stats.get("conflicts", 0),
            quarantined=quarantined,
            late_beyond_horizon=stats.get("late", 0),
            truncates=counts.truncates,
            tombstones_written=stats.get("tombstones_written", 0),
            tombstones_live=tombstones - collected,
            tombstones_collected=collected,
            seconds=round(time.perf_counter() - started, 3),
            steps=steps.seconds,
        )

    def current(self, spark: SparkSession) -> DataFrame:
        """The live rows only: for type 2, each key's open version (``__END_AT`` NULL).

        With ``max_staleness``, the target merged with every change staged so far: the
        rows the target will hold once they are applied (a snapshot: staged changes and
        target as they are now)."""
        target = self.fresh(spark)
        if self.stored_as_scd_type == 1:
            return target
        return target.where(col(END_AT).isNull()).drop(START_AT, END_AT)

    def fresh(self, spark: SparkSession) -> DataFrame:
        """The whole target (type 2: every version), merged with the staged changes of a
        flow with ``max_staleness``; else the target as it is."""
        if self.max_staleness is None:
            return tables.read(spark, self.target)
        read = staged.read(spark, self.target, self.flow_name)
        if read.rows is None:
            return tables.read(spark, self.target)
        with tuning.engine_settings(spark):
            return self._merged(spark, read.rows)

    def current_view(self, spark: SparkSession, name: str | None = None) -> str:
        """Register :meth:`current` as a temporary view (default ``<table>__autocdc_current``)
        for Spark SQL, and return its name; it shows the rows as of this call: register
        it again to see later changes."""
        view = name or self.target.rpartition(".")[2] + CURRENT_VIEW_SUFFIX
        self.current(spark).createOrReplaceTempView(view)
        return view

    def as_of(self, spark: SparkSession, sequence: object) -> DataFrame:
        """Type 2: the rows as they were at ``sequence`` (a value or a Column of the
        sequence's type), i.e. the versions with ``__START_AT <= sequence < __END_AT``.

        With no ``sequence_by`` the validity columns hold ``_CHANGE_SEQUENCE_NUMBER`` as
        :func:`autocdc.hex_sequence` does (four numeric sections), and ``sequence`` may be
        the text itself: ``flow.as_of(spark, "16/B374D848")``."""
        if self.sequence_by is None and isinstance(sequence, str):
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
        if (
            self.stored_as_scd_type == 2
            or self.sequence_groups is not None
            or not tables.exists(spark, self.state_table)
        ):
            return 0
        if self.max_staleness is not None:  # collected against an applied target only
            self.apply_staged(spark)
        layout = fit.stored_layout(spark, self, self.state_table)
        with tuning.engine_settings(spark):
            for _ in range(MAX_ATTEMPTS):
                attempt = time.perf_counter()
                try:
                    return self._collect(spark, layout)
                except tables.RETRYABLE:
                    _wait_after_losing(attempt)
        raise ConcurrentWriteError(table=self.state_table, attempts=MAX_ATTEMPTS)

    def _collect(self, spark: SparkSession, layout: st.Layout) -> int:
        self._gc_clock = time.monotonic()
        commit.fold(spark, self._catch_up(spark), layout.schema())  # compact it all
        # With sequence groups nothing is collected (compacted only): a group's tombstone
        # is all that keeps its older upserts out, and there is no horizon per group.
        retention = MAX_RETENTION_DAYS if layout.grouped else self.tombstone_retention_days
        collected = gc.compact(spark, self.state_table, layout, retention)
        self._forget()
        return collected

    def full_refresh(self, spark: SparkSession) -> None:
        """Drop the target, its state and its quarantine: the next ``apply`` starts over.

        The way to change what the state depends on (keys, the sequence's type, the SCD
        type, whether the target is partial): replay the source from the start afterwards.
        """
        for table in (self.target, self.state_table, self.quarantine_table):
            tables.drop(spark, table)
        staged.drop(spark, self.target)
        commit.drop_redo(spark, self._names)
        self._forget()
        self._gc_clock = None
        self._known = None


def conformed(df: DataFrame, fitted: fit.Fit) -> DataFrame:
    """``df`` with its keys and values cast to the stored types (missing ones NULL) and,
    on a partial target, each upsert's "sets" flags; its other columns as they are."""
    columns = set(fitted.layout.key_names + fitted.layout.value_names)
    return df.select(
        *[col(c) for c in df.columns if c not in columns], *fitted.conform, *fitted.sets
    )


def _counts(staged: stage.StagedBatch, keys: list[StructField], listed: bool) -> Counts:
    """One aggregate over the cached batch (which it materializes); the key range (with
    ``listed``, the keys themselves when there are few) rides on it rather than costing a
    job of its own."""
    ok = col(REASON).isNull()
    keyed = ok & (col(OP) != TRUNCATE)
    skipped = col(REASON) == stage.SKIPPED
    row = staged.tagged.agg(
        F.count(F.when(~F.coalesce(skipped, F.lit(False)), 1)).alias("rows_in"),
        F.count(F.when(~skipped, 1)).alias("rejected"),
        F.count(F.when(skipped, 1)).alias("skipped"),
        F.count(F.when(ok & (col(OP) == TRUNCATE), 1)).alias("truncates"),
        F.count(F.when(keyed, 1)).alias("keyed"),
        F.count(F.when(keyed & (col(OP) == DELETE), 1)).alias("deletes"),
        *bound.aggregates(keys, keyed, listed=listed),
    ).first()
    return Counts(
        rows_in=row["rows_in"],
        rejected=row["rejected"],
        skipped=row["skipped"],
        truncates=row["truncates"],
        keyed=row["keyed"],
        deletes=row["deletes"],
        key_range=bound.from_row(row, keys),
    )
