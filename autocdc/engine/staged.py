"""``StagedFlow``: a flow with ``max_staleness``, which stages its micro-batches and
applies them when due.

A micro-batch is validated (its bad rows quarantined, as an apply would) and appended to
the staging table (:mod:`autocdc.engine.staged_table`), nothing else read or written;
the staged changes are applied as one batch of the wrapped flow once the oldest is older
than ``max_staleness`` (or ``max_staged_rows`` are staged). Reads in between merge the
staged changes into the target at read time (:meth:`StagedFlow.fresh`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from autocdc.engine import change_rows, fit, metrics, quarantine, stage, tables, tuning
from autocdc.engine import staged_table as table
from autocdc.engine.batch import NOTHING, count
from autocdc.engine.errors import MaxStalenessUnsupportedError
from autocdc.engine.faults import crash_point
from autocdc.engine.metrics import BatchMetrics, Steps
from autocdc.engine.spec import FlowDefinition
from autocdc.engine.stage import REASON
from autocdc.engine.tables import col


class Flow(Protocol):
    """What a staged flow needs of the flow it wraps (an ``AutoCdcFlow``)."""

    definition: FlowDefinition

    @property
    def state_table(self) -> str: ...

    @property
    def quarantine_table(self) -> str: ...

    @property
    def tombstones(self) -> int: ...

    def committed_batch(self, spark: SparkSession) -> int: ...

    def apply_now(self, df: DataFrame, maintain: bool = True) -> BatchMetrics: ...

    def maintain(self, spark: SparkSession) -> int: ...

    def preview(self, df: DataFrame) -> DataFrame: ...


class StagedFlow:
    """``flow`` with its micro-batches staged: :meth:`stage`, :meth:`apply` (what is
    staged), :meth:`fresh` (the target with the staged changes merged in)."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        # What the flow last knew to be staged, and at which version of the staging table.
        self._known: table.Known | None = None

    def forget(self) -> None:
        self._known = None

    def stage(self, df: DataFrame, stage_id: int | None = None) -> BatchMetrics:
        """Stage one micro-batch: its bad rows are quarantined, the rest appended to the
        staging table, nothing else is read or written; then the staged changes are
        applied if they are due (the oldest older than ``max_staleness``, or
        ``max_staged_rows`` staged).

        ``stage_id`` (increasing, e.g. a streaming batch id) makes a replay stage nothing
        twice; without it each call takes the next id. The returned metrics are the
        stage's, or the apply's when it ran, with the staged counts after it."""
        started = time.perf_counter()
        spark = df.sparkSession
        stage.check_deterministic(df, self.flow.definition)
        with tuning.engine_settings(spark):
            staged = self._stage_once(spark, df, stage_id, started)
        pending = self._pending(spark)
        applied = self.apply(spark) if self._due(pending) else None
        if applied is None:
            return replace(
                staged,
                staged_batches=pending.batches,
                staged_rows=pending.rows,
                oldest_staged_seconds=pending.age_seconds,
                seconds=round(time.perf_counter() - started, 3),
            )
        return replace(
            applied,
            rows_in=staged.rows_in,
            skipped=staged.skipped,
            quarantined=staged.quarantined + applied.quarantined,
            stage_id=staged.stage_id,
            rows_staged=staged.rows_staged,
            steps={**staged.steps, **{f"apply.{k}": v for k, v in applied.steps.items()}},
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
        flow, spec, steps = self.flow, self.flow.definition, Steps()
        done = table.last_stage(spark, spec.target, spec.flow_name)
        stage_id = done + 1 if stage_id is None else stage_id
        committed = flow.committed_batch(spark)
        if stage_id <= done:  # a replay of a staged micro-batch
            replayed = metrics.measured(
                spec, started, committed, NOTHING, steps, tombstones=flow.tombstones
            )
            return replace(replayed, stage_id=stage_id)
        fitted = fit.fit(spark, spec, df, flow.state_table)
        if fitted.layout.partial:
            raise MaxStalenessUnsupportedError(
                flow=spec.flow_name, why=f"target `{spec.target}`, created partial"
            )
        fit.prepare_tables(spark, spec, fitted, flow.state_table)
        steps.lap("prepare")
        shaped = fit.conformed(df, fitted)
        batch = stage.stage(shaped, spec, fitted.layout.key_names, list(df.columns))
        try:
            counts = count(batch, fitted.layout.keys)
            steps.lap("stage")
            quarantined = rows_staged = 0
            if counts.rejected:
                rejected = quarantine.rows(
                    batch.rejected, batch.source_columns, spec.flow_name, stage_id
                )
                quarantine.create(spark, flow.quarantine_table)
                quarantine.append(spark, flow.quarantine_table, rejected)
                quarantined = counts.rejected
            steps.lap("quarantine")
            if counts.rows_in > counts.rejected:
                kept = [c for c in shaped.columns if c != change_rows.NO_CHANGE]
                good = batch.tagged.where(col(REASON).isNull()).select(*[col(c) for c in kept])
                rows_staged = self._append(spark, good, stage_id, counts.rows_in - counts.rejected)
            steps.lap("staged")
        finally:
            batch.tagged.unpersist()
        measured = metrics.measured(
            spec,
            started,
            committed,
            counts,
            steps,
            quarantined=quarantined,
            tombstones=flow.tombstones,
        )
        return replace(measured, stage_id=stage_id, rows_staged=rows_staged)

    def _append(self, spark: SparkSession, good: DataFrame, stage_id: int, rows: int) -> int:
        """Append the stage's ``rows`` good rows; how many it staged (0: a replay). What is
        staged stays known without a read while only this stage committed since."""
        spec = self.flow.definition
        before, staged_at = table.version(spark, spec.target), time.time()
        known = self._known if self._known and self._known.at == before else None
        crash_point("before_staged_commit")
        tagged = table.tagged(good, spec.flow_name, stage_id)
        appended = table.append(spark, spec.target, spec.flow_name, stage_id, tagged)
        crash_point("after_staged_commit")
        self._known = None  # read again, unless only this stage committed since
        after = table.version(spark, spec.target)
        if appended and known is not None and after == max(before, 0) + 1:
            self._known = table.Known(after, known.after_stage(rows, staged_at))
        return rows if appended else 0

    def _due(self, pending: table.Status) -> bool:
        """Whether the staged changes are to be applied: the oldest is older than
        ``max_staleness``, or ``max_staged_rows`` are staged."""
        spec = self.flow.definition
        if not pending.rows or spec.max_staleness is None:
            return False
        return (pending.age_seconds or 0.0) >= spec.max_staleness.total_seconds() or (
            spec.max_staged_rows is not None and pending.rows >= spec.max_staged_rows
        )

    def apply_if_due(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply the staged changes if they are due (see :meth:`stage`); None if not: what
        a long-running process calls between micro-batches, when a source is quiet."""
        return self.apply(spark) if self._due(self._pending(spark)) else None

    def _pending(self, spark: SparkSession) -> table.Status:
        """What the flow holds staged: as it last knew while the staging table is at the
        version it knew it at (its own stage the last commit), else read (one job)."""
        spec = self.flow.definition
        at = table.version(spark, spec.target)
        if self._known is None or self._known.at != at:
            status = table.status(spark, spec.target, spec.flow_name, last_apply=False)
            self._known = table.Known(at, status)
        return self._known.status

    def apply(self, spark: SparkSession) -> BatchMetrics | None:
        """Apply every change the flow has staged, as one batch; None when nothing is
        staged. Safe to repeat after a crash (an apply killed after its commit is applied
        again next time: a replay, which changes nothing). Tombstones are collected only
        once the applied changes are cleared."""
        spec = self.flow.definition
        read = table.read(spark, spec.target, spec.flow_name)
        if read.rows is None:
            return None
        applied = self.flow.apply_now(read.rows, maintain=False)
        crash_point("after_staged_apply")
        table.clear(spark, spec.target, spec.flow_name, read.upto)
        collected = self.flow.maintain(spark)
        pending = self._pending(spark)
        return replace(
            applied,
            tombstones_collected=collected,
            tombstones_live=applied.tombstones_live - collected,
            applied_staged=read.count,
            staged_batches=pending.batches,
            staged_rows=pending.rows,
            oldest_staged_seconds=pending.age_seconds,
        )

    def status(self, spark: SparkSession) -> table.Status:
        """What the flow holds staged: batches, rows, the oldest's age, the last apply."""
        spec = self.flow.definition
        return table.status(spark, spec.target, spec.flow_name)

    def fresh(self, spark: SparkSession) -> DataFrame:
        """The whole target (type 2: every version) merged with every staged change."""
        spec = self.flow.definition
        read = table.read(spark, spec.target, spec.flow_name)
        if read.rows is None:
            return tables.read(spark, spec.target)
        with tuning.engine_settings(spark):
            return self.flow.preview(read.rows)
