"""SCD type 2's reconcile: the batch's changes against the log of the keys they touch.

The state table is the key's change log (deduplicated upserts and deletes, one row each,
``__autocdc_ups`` holding the change's sequence and ``__autocdc_live`` true for an
upsert). A change is new unless its key logged the same change; the new ones are the
batch's state rows, and only keys with a new change reach the MERGE, whose versions
:mod:`~autocdc.engine.scd2.history` computes from the rows marked here.

Where every column is tracked and upserts are whole rows (``Layout.log_hashes``, fixed
when the target is created), no change is absorbed by a version whose values it does not
hold, so the log keeps a hash of an upsert's values (a replay is told from a new change
by it) and not the values: a rebuilt key reads its logged upserts' values from the
target's versions (:func:`~autocdc.engine.scd2.history.held_values`). Otherwise the log
keeps the values, and the target is read only by the MERGE.

On a partial target each logged upsert lists the value columns it set (``SETS``); a
column it does not set carries the value of the version it continues, whichever flow set
that value, and NULL after a delete. A row logged with no list (by ``ignore_null_updates``
before the list was kept) set its non-NULL columns.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from autocdc.engine import state as st
from autocdc.engine.stage import OP, SEQ, TRUNCATE, UPSERT
from autocdc.engine.tables import col

# A row's marks: a change of the batch (FRESH), one not logged before (NEW), one that
# repeats a new one (REPEAT); its key has a new change (TOUCHED), continues its history
# with one (SIMPLE) or several (APPEND) after its log, whose last sequence is LOGGED.
FRESH, NEW, REPEAT = "__autocdc_fresh", "__autocdc_new", "__autocdc_repeat"
TOUCHED, SIMPLE, APPEND = "__autocdc_touched", "__autocdc_simple", "__autocdc_append"
LOGGED = "__autocdc_logged"
MARKS = (FRESH, NEW, TOUCHED, SIMPLE, APPEND, REPEAT, LOGGED)


def event_rows(changes: DataFrame, layout: st.Layout, batch_id: int) -> DataFrame:
    """The batch's keyed changes as change-log rows (a delete carries no values; on a
    partial target an upsert lists the columns it sets, and holds only their values; with
    ``log_hashes`` an upsert also carries the hash the log keeps, see :func:`log_rows`), a
    change that repeats another still there (:func:`marked` tells them apart)."""
    is_upsert = col(OP) == UPSERT
    keyed = changes.where(col(OP) != TRUNCATE)
    values = {v: is_upsert for v in layout.value_names}
    extra = []
    if layout.log_hashes:
        extra = [F.when(is_upsert, F.xxhash64(layout.identity())).alias(st.HASH)]
    if layout.logs_sets:
        values = {v: is_upsert & col(st.set_flag(v)) for v in layout.value_names}
        listed = F.array_compact(F.array(*[F.when(c, F.lit(v)) for v, c in values.items()]))
        extra = [F.when(is_upsert, listed).alias(st.SETS)]
    return layout.select(
        keyed.select(
            F.lit(st.EVENT_ROW).alias(st.KIND),
            *[col(k) for k in layout.key_names],
            *[F.when(c, col(v)).alias(v) for v, c in values.items()],
            *extra,
            col(SEQ).alias(st.UPS),
            is_upsert.alias(st.LIVE),
            F.lit(batch_id).cast("long").alias(st.BATCH),
            F.current_timestamp().alias(st.UPDATED_AT),
        )
    )


def log_rows(events: DataFrame, layout: st.Layout) -> DataFrame:
    """Change-log rows as the state table keeps them: with ``log_hashes``, an upsert's
    hash and not its values (the version holding its sequence shows them)."""
    return layout.select(events.drop(*layout.value_names)) if layout.log_hashes else events


def marked(events: DataFrame, logged: DataFrame | None, layout: st.Layout) -> DataFrame:
    """The batch's change-log rows (``events``) beside the ``logged`` rows of their keys,
    spread by key, each marked (see ``MARKS``). ``logged`` None: nothing is logged and no
    two changes share a key, so every change is new and its key's first (not spread:
    nothing is grouped)."""
    if logged is None:
        flags = [F.lit(True).alias(c) for c in (FRESH, NEW, TOUCHED)] + [F.lit(False).alias(REPEAT)]
        return events.select("*", *flags)
    key_cols = [col(k) for k in layout.key_names]
    fresh, new_event = col(FRESH), col(NEW)
    fields = {f.name: f.dataType for f in layout.schema().fields}
    logged_values = [st.HASH] if layout.log_hashes else layout.value_names
    logged_columns = [*layout.key_names, st.UPS, st.LIVE, *logged_values]
    compared = {c: fields[c] for c in logged_columns + ([st.SETS] if layout.logs_sets else [])}
    # The rows of one change, the logged one first: a change is new when no row comes
    # before it, and repeats an earlier one of the batch when a new one does (this
    # window replaced a grouping of the batch's changes, a shuffle and two sorts).
    change = [st.comparable(c, t) for c, t in compared.items()]
    same_change = Window.partitionBy(*change).orderBy(fresh)
    before = F.lag(fresh).over(same_change)
    per_key = Window.partitionBy(*key_cols)
    # A key whose one new change comes after all it logged continues its history
    # (see :func:`~autocdc.engine.scd2.history.changed`); decided here, in the window
    # the plan runs anyway, not in the MERGE's source, which runs twice.
    logged_last = F.max(F.when(~fresh, col(st.UPS))).over(per_key)
    # A key with several new changes, all after its log, continues it too (``APPEND``,
    # see :mod:`~autocdc.engine.scd2.history`): a hot key's history is not recomputed
    # every batch.
    news = F.count(F.when(new_event, 1)).over(per_key)
    appends = (
        F.lit(False)
        if layout.partial
        else F.coalesce(
            F.min(F.when(new_event, col(st.UPS))).over(per_key) > logged_last, F.lit(True)
        )
        & _clear_last(layout, fresh, per_key)
    )
    return (
        logged.withColumn(FRESH, F.lit(False))
        .unionByName(events.withColumn(FRESH, F.lit(True)))
        .repartition(*key_cols)
        .withColumns(
            {NEW: fresh & before.isNull(), REPEAT: fresh & F.coalesce(before, F.lit(False))}
        )
        .withColumns(
            {
                TOUCHED: F.max(new_event).over(per_key),
                SIMPLE: appends & (news == 1),
                APPEND: appends & (news > 1),
                LOGGED: logged_last,
            }
        )
    )


def _clear_last(layout: st.Layout, fresh: Column, per_key: Window) -> Column:
    """Whether the key's last logged change is known without its values: with
    ``log_hashes``, not when two upserts tied at its sequence (the winner is the greater
    by values, which the log does not hold), so such a key is rebuilt."""
    if not layout.log_hashes:
        return F.lit(True)

    def last(hashed: Column) -> Column:
        order = F.struct(col(st.UPS), (~col(st.LIVE)).cast("int").alias("d"), hashed.alias("h"))
        return F.max(F.when(~fresh, order)).over(per_key)

    # The greatest hash at the last sequence, and the least (the greatest bitwise NOT).
    high, low = last(col(st.HASH)), last(F.bitwise_not(col(st.HASH)))
    return F.coalesce((high["d"] == 1) | (high["h"] == F.bitwise_not(low["h"])), F.lit(True))
