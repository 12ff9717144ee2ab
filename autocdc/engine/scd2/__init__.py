"""SCD type 2: a batch's plan, step by step.

The batch's changes are logged against the log of the keys they touch
(:mod:`~autocdc.engine.scd2.reconcile`: which changes are new, which keys continue their
history), in one materialized pass that counts on the way; the touched keys' changed
versions (:mod:`~autocdc.engine.scd2.history`) then go to the target by one MERGE
(:mod:`~autocdc.engine.scd2.merge`, with its merge-on-read,
:mod:`~autocdc.engine.scd2.preview`), or, for an initial load into an empty target, by an
append.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from autocdc.engine import bound as kb
from autocdc.engine import scd
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Plan, into_empty_target, sole_changes
from autocdc.engine.checkpoint import materialized
from autocdc.engine.scd2 import history, merge, preview, reconcile
from autocdc.engine.scd2.reconcile import APPEND, FRESH, MARKS, NEW, REPEAT, SIMPLE, TOUCHED
from autocdc.engine.tables import col

HELD_BOUND = "held"  # the prefix of the rebuilt keys' bound (see :func:`_counts`)


def plan(batch: Batch) -> Plan:
    """Log the batch's new changes; continue or rebuild the touched keys' history.

    One shuffle by key for the whole batch: the log of the batch's keys and its changes
    side by side, materialized once. A change is new unless its key logged the same
    change; only keys with a new change reach the MERGE."""
    layout = batch.layout
    # Nothing logged and a key per change (an initial load): every change is new, and
    # each key only opens its history (a partial target's always takes the general path).
    sole = not layout.partial and sole_changes(batch)
    events = reconcile.event_rows(batch.staged.changes, layout, batch.batch_id)
    load = sole and into_empty_target(batch)
    reads_held = layout.log_hashes and not sole  # a rebuilt key's logged values: the target
    rows = reconcile.marked(events, None if sole else _logged(batch, events), layout)
    if load:
        # Every change is new and its key's first: counted with the batch, and ``rows``
        # (a projection of the cached batch, read by the redo and the append) is not read
        # to count it.
        keyed, deletes = batch.counts.keyed, batch.counts.deletes
        row = {"distinct": keyed, "upserts": keyed - deletes, "deletes": deletes}
    else:
        rows, row = materialized(rows, _counts(batch, reads_held))
    new_events = reconcile.log_rows(rows.where(col(NEW)).drop(*MARKS), layout)
    new = row["upserts"] + row["deletes"]
    stats = {
        "distinct": row["distinct"],
        "late": 0,
        "stale": row["distinct"] - new,
        "changed": new,
        "upserted": row["upserts"],
        "deleted": row["deletes"],
    }
    if not new:
        return Plan(state_rows=new_events, merge=None, late=None, stats=stats)
    if load:  # an initial load into an empty target: each upsert opens a version
        opened = history.opened(layout, rows, history.target_types(layout))
        return Plan(state_rows=new_events, merge=None, late=None, stats=stats, load=opened)
    touched = rows.where(col(TOUCHED) & (~col(FRESH) | col(NEW))).drop(NEW, TOUCHED, REPEAT)
    held = row["held"] if reads_held else 0
    held_bound = kb.from_row(row, layout.keys, prefix=HELD_BOUND)

    def changed() -> DataFrame:
        return history.changed(
            batch.spark, batch.names.target, layout, batch.tracked, touched, sole, held, held_bound
        )

    def read(target: DataFrame) -> DataFrame:
        return preview.preview(layout, target, changed().localCheckpoint(), sole)

    keys_bound = kb.from_row(row, layout.keys)
    run = merge.merge(batch.spark, batch.names.target, layout, changed, keys_bound, sole)
    return Plan(state_rows=new_events, merge=run, late=None, stats=stats, preview=read)


def _logged(batch: Batch, events: DataFrame) -> DataFrame:
    """The logged rows of the keys the batch's changes (``events``) touch."""
    logged = batch.state().where(col(st.KIND) == st.EVENT_ROW)
    return scd.of_batch_keys(
        batch, logged, events.select(*[col(k) for k in batch.layout.key_names])
    )


def _counts(batch: Batch, reads_held: bool) -> list[Column]:
    """What the plan's one pass counts: the batch's distinct changes, the new upserts
    and deletes, and the MERGE's key bound (the keys of new changes); with
    ``reads_held``, also the rebuilt keys' logged upserts, whose values the target holds,
    and their keys' bound (prefixed ``HELD_BOUND``)."""
    keys, listed = batch.layout.keys, scd.listed(batch)
    fresh, new_event = col(FRESH), col(NEW)
    aggregates = [
        F.count(F.when(fresh & ~col(REPEAT), 1)).alias("distinct"),
        F.count(F.when(new_event & col(st.LIVE), 1)).alias("upserts"),
        F.count(F.when(new_event & ~col(st.LIVE), 1)).alias("deletes"),
        *kb.aggregates(keys, new_event, listed=listed),
    ]
    if reads_held:
        held = col(TOUCHED) & ~col(SIMPLE) & ~col(APPEND) & ~fresh & col(st.LIVE)
        aggregates += [
            F.count(F.when(held, 1)).alias("held"),
            *kb.aggregates(keys, held, listed=listed, prefix=HELD_BOUND),
        ]
    return aggregates
