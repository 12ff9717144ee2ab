"""Write a planned batch: its quarantined rows, its redo, the target, the state.

The order is the commit protocol of :mod:`autocdc.engine.commit` (the redo first, the
target MERGE as the commit point, then the quarantine and the state from the redo), so a
crash at any point leaves a batch that a repeat completes or skips.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

from autocdc.engine import commit, quarantine
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Plan
from autocdc.engine.faults import crash_point
from autocdc.engine.metrics import Steps


@dataclass(frozen=True)
class Written:
    """What a batch's commit left: the target MERGE's counts, the state's new meta and
    where the state is now (what the flow knows of its tables until someone else
    commits), and how many rows it quarantined."""

    merged: dict[str, int]
    meta: st.MetaFrame
    stored: commit.Stored
    quarantined: int


def planned(batch: Batch, plan: Plan, steps: Steps) -> Written | None:
    """Commit ``plan``; None when it records nothing (e.g. a replay): no commit, and the
    batch id is not used up."""
    spark, names = batch.spark, batch.names
    q_rows = _quarantined(batch, plan)
    steps.lap("quarantine")
    if not plan.changes_anything and q_rows is None:
        return None
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
    commit.apply_quarantine(spark, names, redo, lambda: quarantine.create(spark, names.quarantine))
    crash_point("after_quarantine")
    stored = batch.stored.after(redo)
    if stored.fold_due():
        stored = commit.fold(spark, stored, batch.layout.schema())
    crash_point("after_state_commit")
    steps.lap("state")
    quarantined = 0 if q_rows is None else batch.counts.rejected + plan.stats.get("late", 0)
    empty = batch.meta.empty and plan.horizons is None
    return Written(merged, st.MetaFrame(grown, horizons, empty), stored, quarantined)


def _quarantined(batch: Batch, plan: Plan) -> DataFrame | None:
    """The batch's rejected rows and the plan's late ones not quarantined yet (a replay's
    are already there), materialized: the redo and the quarantine both read them."""
    staged = batch.staged
    rejected = staged.rejected if batch.counts.rejected else None
    if plan.late is not None:
        rejected = plan.late if rejected is None else rejected.unionByName(plan.late)
    if rejected is None:
        return None
    shaped = quarantine.rows(rejected, staged.source_columns, batch.spec.flow_name, batch.batch_id)
    rows = quarantine.new_rows(batch.spark, batch.names.quarantine, shaped).localCheckpoint()
    return None if rows.isEmpty() else rows
