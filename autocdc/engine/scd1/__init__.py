"""SCD type 1: a batch's plan, step by step.

The batch is reconciled with the state of the keys it touches
(:mod:`~autocdc.engine.scd1.reconcile`, where the semantics are: each key's new state row
and the action the target needs), in one materialized pass that counts on the way; the
actions then go to the target by one MERGE (:mod:`~autocdc.engine.scd1.merge`, with its
merge-on-read, :mod:`~autocdc.engine.scd1.preview`), or, for an initial load into an
empty target, by an append.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from autocdc.engine import bound as kb
from autocdc.engine import scd, sizing
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Plan, into_empty_target, sole_changes
from autocdc.engine.checkpoint import materialized
from autocdc.engine.scd1 import merge, preview, reconcile
from autocdc.engine.scd1.reconcile import (
    ACTION,
    CHANGED,
    CONFLICT,
    LATE,
    M_GC,
    M_TRUNC,
    N_EVENTS,
    N_LATE,
    N_STALE,
    NEW_TRUNC,
    OLD_EXISTS,
    OLD_LIVE,
    TIE,
)
from autocdc.engine.stage import OP, REASON, SEQ, TRUNCATE
from autocdc.engine.tables import col

SOURCE_BYTES = "source_bytes"  # the plan's observation: bytes of the MERGE's source


def plan(batch: Batch) -> Plan:
    """Reconcile the batch against the state of its keys (all keys when it truncates):
    one materialized pass, its counts observed on the way."""
    layout = batch.layout
    changes, quarantine_late = batch.staged.changes, batch.spec.late_beyond_horizon == "quarantine"
    if not layout.grouped and sole_changes(batch):  # nothing stored: no state, no horizon
        events = reconcile.classify(changes, None, None, layout, quarantine_late)
        touched = reconcile.fold(events, None, None, layout, batch.batch_id, False)
        if into_empty_target(batch):
            return _loaded(batch, layout, touched)
        return _planned(batch, layout, events, touched, None)
    bounds = _bounds(batch)
    whole_state = bool(batch.counts.truncates)
    old_state = _old_state(batch, whole_state)
    full, view = layout, old_state
    if full.grouped:  # the batch's group alone, on its own clock
        layout, view = full.group_layout(), reconcile.group_view(old_state, full)
    events = reconcile.classify(changes, view, bounds, layout, quarantine_late)
    touched = reconcile.fold(events, view, bounds, layout, batch.batch_id, whole_state)
    if full.grouped:
        touched = reconcile.regroup(touched, old_state, full)
    return _planned(batch, full, events, touched, _new_horizons(batch, bounds))


def _bounds(batch: Batch) -> DataFrame | None:
    """The horizons the batch is folded against (:func:`~autocdc.engine.scd1.reconcile.horizons`),
    or None when there is none to join: no truncate now or before, nothing collected."""
    if batch.counts.truncates:
        truncate = F.when(col(REASON).isNull() & (col(OP) == TRUNCATE), col(SEQ))
        truncated = batch.staged.tagged.agg(F.max(truncate).alias(NEW_TRUNC))
        return reconcile.horizons(batch.meta.horizons, truncated)
    if not batch.meta.empty:
        none = F.lit(None).cast(batch.layout.sequence).alias(NEW_TRUNC)
        return reconcile.horizons(batch.meta.horizons, batch.spark.range(1).select(none))
    return None


def _old_state(batch: Batch, whole_state: bool) -> DataFrame:
    """The stored state the batch is folded against: its keys' current rows, or every
    key's (``whole_state``: a truncate touches them all)."""
    keys = batch.layout.key_names
    old_state = st.state_rows(batch.state())
    if not whole_state:  # key-pruned: only the state of keys in this batch
        batch_keys = batch.staged.changes.where(col(OP) != TRUNCATE).select(*[col(k) for k in keys])
        old_state = scd.of_batch_keys(batch, old_state, batch_keys)
    old_state = st.current(old_state, keys)
    if whole_state or batch.layout.grouped:  # read once: joined twice (classify, fold or regroup)
        return old_state.localCheckpoint()
    return sizing.small(old_state, batch.counts.keyed)  # joined once, at most a row per batch key


def _new_horizons(batch: Batch, bounds: DataFrame | None) -> DataFrame | None:
    """The state's new horizons when the batch's truncate moves the truncate horizon:
    then they are committed even when no key's state changes (a truncate into an empty
    target, or above keys deleted already), or an older upsert of a key not yet seen
    would be applied after it."""
    if not batch.counts.truncates or bounds is None:
        return None
    moved = F.coalesce(col(NEW_TRUNC) > col(M_TRUNC), col(NEW_TRUNC).isNotNull())
    if not bounds.select(moved).first()[0]:
        return None
    return bounds.select(col(NEW_TRUNC).alias(st.DEL), col(M_GC).alias(st.FLOOR)).localCheckpoint()


def _loaded(batch: Batch, layout: st.Layout, touched: DataFrame) -> Plan:
    """An initial load: the batch's changes are sole, nothing is stored and the target is
    empty, so each change is its key's first and changes the state, an upsert inserts and
    a delete leaves a tombstone. The counts follow from the batch's: ``touched`` (a
    projection of the cached batch, read by the redo and the append) is not read to count
    it (that pass would double a large load's plan step). Its rows are appended, no
    MERGE."""
    keyed, deletes = batch.counts.keyed, batch.counts.deletes
    stats = {
        "distinct": keyed,
        "late": 0,
        "stale": 0,
        "tombstones_written": deletes,
        "tombstone_delta": deletes,
        "conflicts": 0,
        "changed": keyed,
        "new_keys": keyed,
        "actions": keyed - deletes,
        "ties": 0,
    }
    inserts = touched.where(col(ACTION).isNotNull())
    return Plan(
        state_rows=layout.select(touched.where(col(CHANGED))),
        merge=None,
        late=None,
        stats=stats,
        load=(
            inserts.select(*[col(c) for c in [*layout.key_names, *layout.value_names]])
            if stats["actions"]
            else None
        ),
    )


def _planned(
    batch: Batch,
    full: st.Layout,
    events: DataFrame,
    touched: DataFrame,
    new_horizons: DataFrame | None,
) -> Plan:
    """The plan of the ``touched`` keys, materialized with the counts and the MERGE's key
    bound observed on the way."""
    layout = full.group_layout() if full.grouped else full
    staged = batch.staged
    changed, live, old_live = col(CHANGED), col(st.LIVE), col(OLD_LIVE)
    # Upserts the MERGE must settle against the target's row (not on a partial target:
    # its MERGE compares per column).
    tied = F.lit(False) if layout.per_column_sequences else col(TIE)
    was_tombstone = col(OLD_EXISTS) & ~old_live

    def total(name: str) -> Column:
        return F.coalesce(F.sum(name), F.lit(0))

    def count(condition: Column) -> Column:
        return F.count(F.when(condition, 1))

    aggregates = [
        F.struct(
            total(N_EVENTS).alias("distinct"),
            total(N_LATE).alias("late"),
            total(N_STALE).alias("stale"),
            count(changed & ~live).alias("tombstones_written"),
            (count(changed & ~live & ~was_tombstone) - count(changed & live & was_tombstone)).alias(
                "tombstone_delta"
            ),
            count(changed & col(CONFLICT)).alias("conflicts"),
            count(changed).alias("changed"),
            count(changed & ~col(OLD_EXISTS)).alias("new_keys"),
            count(col(ACTION).isNotNull()).alias("actions"),
            count(col(ACTION).isNotNull() & tied).alias("ties"),
        ).alias("stats"),
        # The MERGE's key bound: the keys with an action (listed if there can be few).
        *kb.aggregates(full.keys, col(ACTION).isNotNull(), listed=scd.listed(batch)),
        # What the MERGE's source takes, for its broadcast (``sizing``).
        F.sum(
            F.when(col(ACTION).isNotNull(), sizing.row_bytes([*layout.keys, *layout.values]))
        ).alias(SOURCE_BYTES),
    ]
    touched, row = materialized(touched, aggregates)
    stats = row["stats"].asDict()
    late = None
    if stats["late"]:
        late = events.where(col(LATE)).select(
            *[col(c) for c in [*staged.source_columns, SEQ, REASON]]
        )
    state_rows = full.select(touched.where(changed))
    return Plan(
        state_rows=state_rows,
        merge=(
            merge.merge(
                batch.spark,
                batch.names.target,
                layout,
                touched,
                kb.from_row(row, full.keys),
                stats["actions"],
                stats["ties"],
                row[SOURCE_BYTES],
            )
            if stats["actions"]
            else None
        ),
        late=late,
        stats=stats,
        horizons=new_horizons,
        preview=(
            preview.preview(layout, touched, stats["ties"])
            if stats["actions"] and not layout.per_column_sequences
            else None
        ),
    )
