"""Reconcile one staged batch against the state of the keys it touches (SCD type 1).

The fold of SEMANTICS.md, computed per key without replaying history:

* the winning upsert is the greatest ``(sequence, row)``: at equal sequence the greatest
  row wins, compared column by column in target order with NULL lowest (maps compare as
  JSON). With ``ignore_null_updates`` the same rule runs per column over non-NULL values;
* a delete or truncate at a sequence removes every upsert at or below it (at equal
  sequence the delete orders after the upsert);
* a key is live when its upsert sequence is above its delete sequence.

Every comparison uses only what the state row keeps, so two tied changes reach the same
winner whether they arrive in one batch or in two.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from autocdc.engine import state as st
from autocdc.engine.errors import QUARANTINE_LATE_BEYOND_HORIZON
from autocdc.engine.stage import DELETE, OP, REASON, SEQ, TRUNCATE, UPSERT, col

# Per-event and per-key working columns (never stored); see state.derived for names.
M_GC, M_TRUNC, NEW_TRUNC = "__autocdc_m_gc", "__autocdc_m_trunc", "__autocdc_new_trunc"
DEDUP = "__autocdc_dedup"
LATE, STALE = "__autocdc_late", "__autocdc_stale"
B_UPS, B_DEL, B_VER, B_VAL = (
    "__autocdc_b_ups",
    "__autocdc_b_del",
    "__autocdc_b_ver",
    "__autocdc_b_val",
)
OLD_EXISTS, OLD_LIVE, CONFLICT = "__autocdc_o_exists", "__autocdc_o_live", "__autocdc_conflict"
IMAGE_CHANGED, CHANGED = "__autocdc_image_changed", "__autocdc_changed"
# Per key: events folded, events in all, late and stale ones (the batch's metrics).
N_OK, N_EVENTS, N_LATE, N_STALE = (
    "__autocdc_n_ok",
    "__autocdc_n_events",
    "__autocdc_n_late",
    "__autocdc_n_stale",
)


def b_col(name: str) -> str:
    """The batch's winning value of user column ``name`` (ignore_null_updates)."""
    return st.derived("b", name)


def b_ver(name: str) -> str:
    """The (sequence, value) that won column ``name`` in the batch."""
    return st.derived("bv", name)


def old(name: str) -> str:
    """Column ``name`` of the key's state as of before this batch."""
    return st.derived("o", name)


def _row_tie(layout: st.Layout, rename: bool = False) -> Column:
    """The tie-breaker of equal-sequence upserts: the row's values, in stored order."""
    return F.struct(
        *[
            st.comparable(old(f.name) if rename else f.name, f.dataType).alias(f.name)
            for f in layout.values
        ]
    )


def truncate_horizon(batch_max: DataFrame, meta: DataFrame) -> DataFrame:
    """One row: the truncate horizon before (M_TRUNC) and after (NEW_TRUNC) this batch,
    and the collected-tombstone horizon (M_GC). ``batch_max`` is one row with the
    batch's greatest truncate sequence in NEW_TRUNC; horizons never leave Spark."""
    return (
        F.broadcast(meta.select(col(st.FLOOR).alias(M_GC), col(st.DEL).alias(M_TRUNC)))
        .crossJoin(batch_max.select(NEW_TRUNC))
        .select(F.greatest(NEW_TRUNC, M_TRUNC).alias(NEW_TRUNC), M_TRUNC, M_GC)
    )


def classify(
    changes: DataFrame,
    old_state: DataFrame,
    truncate: DataFrame,
    layout: st.Layout,
    quarantine_late: bool,
) -> DataFrame:
    """Deduplicate the batch's keyed changes and flag each as LATE (beyond the horizon,
    to quarantine) or STALE (older than the state already held).

    ``truncate`` is the one-row frame of :func:`truncate_horizon`.
    """
    keys = layout.key_names
    # Exact duplicates: a delete is its key and sequence, an upsert also its values.
    keyed = changes.where(col(OP) != TRUNCATE).withColumn(
        DEDUP, F.when(col(OP) == UPSERT, _row_tie(layout))
    )
    keyed = keyed.dropDuplicates([*keys, SEQ, OP, DEDUP])

    olds = old_state.select(
        *[col(k) for k in keys],
        *[col(c).alias(old(c)) for c in (st.UPS, st.DEL, st.FLOOR)],
        F.lit(True).alias(OLD_EXISTS),
    )
    events = keyed.join(olds, keys, "left").crossJoin(F.broadcast(truncate))
    # The horizon rule is for keys with no state; a key with state (re-created after its
    # tombstone was collected) judges its own old changes: stale, below its floor.
    late = (
        col(OLD_EXISTS).isNull() & F.coalesce(col(SEQ) <= col(M_GC), F.lit(False))
        if quarantine_late
        else F.lit(False)
    )
    newest_old = F.greatest(old(st.UPS), old(st.DEL))
    # At or below what the state held; a delete at the upsert's own sequence still wins.
    stale = F.coalesce(
        (col(SEQ) < newest_old)
        | (col(SEQ) == col(old(st.DEL)))
        | ((col(OP) == UPSERT) & (col(SEQ) == col(old(st.UPS))))
        | _below_floor(),
        F.lit(False),
    )
    events = (
        events.withColumn(LATE, late)
        .withColumn(STALE, ~col(LATE) & stale)
        .withColumn(REASON, F.when(col(LATE), F.lit(QUARANTINE_LATE_BEYOND_HORIZON)))
    )
    return events


def _below_floor() -> Column:
    """At or below the collected-tombstone horizon the key's state was created under."""
    return F.coalesce(col(SEQ) <= col(old(st.FLOOR)), F.lit(False))


def fold(
    events: DataFrame, old_state: DataFrame, truncate: DataFrame, layout: st.Layout, batch_id: int
) -> DataFrame:
    """The new state row of every key the batch touches, flagged CHANGED where it differs
    from the stored one, with the key's event counts: one pass yields both the rows to
    write and the batch's metrics."""
    # A change at or below the key's stored delete is dead on arrival: leave the row as is.
    dead = F.coalesce(col(SEQ) <= col(old(st.DEL)), F.lit(False)) | _below_floor()
    per_key = _fold_batch(events, ~col(LATE) & ~dead, layout)
    return _combine(per_key, old_state, truncate, layout, batch_id)


def _fold_batch(events: DataFrame, ok: Column, layout: st.Layout) -> DataFrame:
    """Per key: the winning upsert (or per-column winners) and latest delete among the
    ``ok`` events, and the counts of all of them."""
    is_upsert = ok & (col(OP) == UPSERT)
    aggs = [
        F.count(F.when(ok, 1)).alias(N_OK),
        F.count(F.lit(1)).alias(N_EVENTS),
        F.count(F.when(col(LATE), 1)).alias(N_LATE),
        F.count(F.when(col(STALE), 1)).alias(N_STALE),
        F.max(F.when(is_upsert, col(SEQ))).alias(B_UPS),
        F.max(F.when(ok & (col(OP) == DELETE), col(SEQ))).alias(B_DEL),
        # Different upserts at one key and sequence in this batch: counted, then tie-broken.
        (
            F.countDistinct(F.when(is_upsert, F.struct(col(SEQ), col(DEDUP))))
            > F.countDistinct(F.when(is_upsert, col(SEQ)))
        ).alias(CONFLICT),
    ]
    if layout.per_column_sequences:
        for f in layout.values:
            ver = F.when(
                is_upsert & col(f.name).isNotNull(),
                F.struct(col(SEQ).alias("s"), st.comparable(f.name, f.dataType).alias("t")),
            )
            aggs += [
                F.max(ver).alias(b_ver(f.name)),
                F.max_by(col(f.name), ver).alias(b_col(f.name)),
            ]
    else:
        ver = F.when(is_upsert, F.struct(col(SEQ).alias("s"), col(DEDUP).alias("t")))
        aggs += [
            F.max(ver).alias(B_VER),
            F.max_by(F.struct(*[col(v) for v in layout.value_names]), ver).alias(B_VAL),
        ]
    return events.groupBy(*layout.key_names).agg(*aggs)


def _combine(
    per_key: DataFrame,
    old_state: DataFrame,
    truncate: DataFrame,
    layout: st.Layout,
    batch_id: int,
) -> DataFrame:
    """Fold the batch's per-key result into the old state."""
    keys, values = layout.key_names, layout.value_names
    stored = [c for c in layout.schema().names if c not in keys and c != st.KIND]
    olds = old_state.select(
        *[col(k) for k in keys],
        *[col(c).alias(old(c)) for c in stored],
        F.lit(True).alias(OLD_EXISTS),
    )
    df = per_key.join(olds, keys, "full").crossJoin(F.broadcast(truncate))
    old_exists = F.coalesce(col(OLD_EXISTS), F.lit(False))

    dele = F.greatest(old(st.DEL), B_DEL, NEW_TRUNC)
    ups = F.greatest(old(st.UPS), B_UPS)
    out: dict[str, Column] = {st.KIND: F.lit(st.STATE_ROW)}
    out |= {k: col(k) for k in keys}

    if layout.per_column_sequences:
        for f in layout.values:
            old_ver = F.when(
                col(old(st.column_seq(f.name))).isNotNull(),
                F.struct(
                    col(old(st.column_seq(f.name))).alias("s"),
                    st.comparable(old(f.name), f.dataType).alias("t"),
                ),
            )
            new_ver = col(b_ver(f.name))
            take = new_ver.isNotNull() & (old_ver.isNull() | (new_ver > old_ver))
            seq = F.when(take, new_ver["s"]).otherwise(col(old(st.column_seq(f.name))))
            wiped = F.coalesce(seq <= dele, F.lit(False))  # a later delete erased it
            out[f.name] = (
                F.when(wiped, None).when(take, col(b_col(f.name))).otherwise(col(old(f.name)))
            )
            out[st.column_seq(f.name)] = F.when(~wiped, seq)
        conflict = F.coalesce(col(CONFLICT), F.lit(False))
    else:
        old_ver = F.when(
            col(old(st.UPS)).isNotNull(),
            F.struct(col(old(st.UPS)).alias("s"), _row_tie(layout, rename=True).alias("t")),
        )
        take = col(B_VER).isNotNull() & (old_ver.isNull() | (col(B_VER) > old_ver))
        for v in values:
            out[v] = F.when(take, col(B_VAL)[v]).otherwise(col(old(v)))
        tied_across = (col(B_VER)["s"] == old_ver["s"]) & (col(B_VER)["t"] != old_ver["t"])
        conflict = F.coalesce(col(CONFLICT), F.lit(False)) | F.coalesce(tied_across, F.lit(False))

    out[st.UPS] = ups
    out[st.DEL] = dele
    out[st.FLOOR] = F.when(old_exists, col(old(st.FLOOR))).otherwise(col(M_GC))
    out[st.LIVE] = ups.isNotNull() & F.coalesce(ups > dele, F.lit(True))
    out[st.BATCH] = F.lit(batch_id).cast("long")
    out[st.UPDATED_AT] = F.current_timestamp()

    counts = [F.coalesce(col(n), F.lit(0)).alias(n) for n in (N_OK, N_EVENTS, N_LATE, N_STALE)]
    df = df.select(
        *[c.alias(name) for name, c in out.items()],
        *counts,
        old_exists.alias(OLD_EXISTS),
        F.coalesce(col(old(st.LIVE)), F.lit(False)).alias(OLD_LIVE),
        conflict.alias(CONFLICT),
        *[col(old(c)) for c in stored if c not in (st.BATCH, st.UPDATED_AT, *st.META_ONLY)],
    )
    compared = [c for c in stored if c not in (st.LIVE, st.BATCH, st.UPDATED_AT, *st.META_ONLY)]
    fields = {f.name: f.dataType for f in layout.schema().fields}

    def same(names: list[str]) -> Column:
        return reduce(
            lambda a, b: a & b,
            [
                st.comparable(n, fields[n]).eqNullSafe(st.comparable(old(n), fields[n]))
                for n in names
            ],
            F.lit(True),
        )

    # A key without state changes once an event of it is folded (not all were late/dead).
    changed = F.when(col(OLD_EXISTS), ~same(compared)).otherwise(col(N_OK) > 0)
    return (
        df.withColumn(IMAGE_CHANGED, ~same(values))
        .withColumn(CHANGED, changed)
        .drop(*[old(c) for c in compared])
    )
