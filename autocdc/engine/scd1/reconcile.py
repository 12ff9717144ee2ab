"""SCD type 1's reconcile: one staged batch against the state of the keys it touches.

The fold of docs/semantics.md, computed per key without replaying history:

* the winning upsert is the greatest ``(sequence, row)``: at equal sequence the greatest
  row wins, compared column by column in the declared tie order with NULL lowest (maps
  compare as JSON). On a partial target (partial upserts, ``ignore_null_updates``) the
  same rule runs per column, over the upserts that set the column: a column holds the
  value of the greatest ``(sequence, value)`` upsert that sets it above the key's latest
  delete, which the state's per-column sequences make independent of arrival order;
* a delete or truncate at a sequence removes every upsert at or below it (at equal
  sequence the delete orders after the upsert);
* a key is live when its upsert sequence is above its delete sequence.

With sequence groups a batch (one flow's) is of one group: it is folded as above against
that group's sequences only (:func:`group_view`: its columns, its clock), then put back
beside the other groups' stored sequences (:func:`regroup`), the key live while any
group is.

The state keeps sequences, not values; a live key's values are the target's. So an upsert
that ties the stored winner's sequence cannot be settled here: if its hash equals the
stored winner's it is a duplicate, else it is flagged as a tie and compared with the row
the target holds, read for the tied keys just before the MERGE (on a partial target, in
the MERGE, per column). Both tied changes are thus judged by the same rule whether they
arrive in one batch or in two.

One pass yields, per touched key, the new state row, whether it changed, the change the
target needs (``ACTION``: delete, or upsert with per-column instructions, which
:mod:`~autocdc.engine.scd1.merge` writes) and the key's event counts for the batch metrics.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from autocdc.engine import state as st
from autocdc.engine.errors import QUARANTINE_LATE_BEYOND_HORIZON
from autocdc.engine.stage import DELETE, OP, REASON, SEQ, TRUNCATE, UPSERT
from autocdc.engine.tables import col

# Horizons: collected tombstones (M_GC), truncates before (M_TRUNC) and after (NEW_TRUNC).
M_GC, M_TRUNC, NEW_TRUNC = "__autocdc_m_gc", "__autocdc_m_trunc", "__autocdc_new_trunc"
DEDUP, EV_HASH = "__autocdc_dedup", "__autocdc_ev_hash"
LATE, STALE = "__autocdc_late", "__autocdc_stale"
B_UPS, B_DEL, B_VER, B_VAL = (
    "__autocdc_b_ups",
    "__autocdc_b_del",
    "__autocdc_b_ver",
    "__autocdc_b_val",
)
OLD_EXISTS, OLD_LIVE, CONFLICT = "__autocdc_o_exists", "__autocdc_o_live", "__autocdc_conflict"
ROW = "__autocdc_row"  # a key's events, numbered
SHARED = "__autocdc_shared"  # an upsert whose key and sequence another upsert shares
TWIN = "__autocdc_twin"  # a duplicate of the change before it
CHANGED, ACTION, TIE = "__autocdc_changed", "__autocdc_action", "__autocdc_tie"
OTHER_LIVE = "__autocdc_other_live"  # sequence groups: another group keeps the key live
ACT_DELETE, ACT_UPSERT = "D", "U"
# Per key: events folded, events in all, late and stale ones (the batch's metrics).
N_OK, N_EVENTS, N_LATE, N_STALE = (
    "__autocdc_n_ok",
    "__autocdc_n_events",
    "__autocdc_n_late",
    "__autocdc_n_stale",
)


def b_col(name: str) -> str:
    """The batch's winning value of user column ``name`` (partial target)."""
    return st.derived("b", name)


def b_ver(name: str) -> str:
    """The (sequence, value) that won column ``name`` in the batch."""
    return st.derived("bv", name)


def old(name: str) -> str:
    """Column ``name`` of the key's state as of before this batch."""
    return st.derived("o", name)


def take(name: str) -> str:
    """Target instruction: set column ``name`` to the batch's value."""
    return st.derived("take", name)


def tie(name: str) -> str:
    """Target instruction: the batch's value ties the stored one's sequence (compare)."""
    return st.derived("tie", name)


def wipe(name: str) -> str:
    """Target instruction: a delete in the batch erased column ``name``."""
    return st.derived("wipe", name)


def horizons(meta: DataFrame, batch_truncate: DataFrame) -> DataFrame:
    """One row: the truncate horizon before (M_TRUNC) and after (NEW_TRUNC) this batch,
    and the collected-tombstone horizon (M_GC). ``batch_truncate`` is one row with the
    batch's greatest truncate sequence in NEW_TRUNC; horizons never leave Spark."""
    return (
        F.broadcast(meta.select(col(st.FLOOR).alias(M_GC), col(st.DEL).alias(M_TRUNC)))
        .crossJoin(batch_truncate.select(NEW_TRUNC))
        .select(F.greatest(NEW_TRUNC, M_TRUNC).alias(NEW_TRUNC), M_TRUNC, M_GC)
    )


def with_bounds(df: DataFrame, bounds: DataFrame | None, layout: st.Layout) -> DataFrame:
    """``df`` with the horizon columns: joined from ``bounds``, or NULL when there are
    none (no truncate, nothing collected: the common case, and no join)."""
    if bounds is not None:
        return df.crossJoin(F.broadcast(bounds))
    null = F.lit(None).cast(layout.sequence)
    return df.select("*", *[null.alias(c) for c in (NEW_TRUNC, M_TRUNC, M_GC)])


def classify(
    changes: DataFrame,
    old_state: DataFrame | None,
    bounds: DataFrame | None,
    layout: st.Layout,
    quarantine_late: bool,
) -> DataFrame:
    """Deduplicate the batch's keyed changes and flag each as LATE (beyond the horizon,
    to quarantine) or STALE (no effect on the state already held). ``old_state`` None:
    the batch's changes are sole (:func:`~autocdc.engine.batch.sole_changes`), so there
    is nothing to deduplicate or join, and no shuffle."""
    keys = layout.key_names
    keyed = changes.where(col(OP) != TRUNCATE)
    if old_state is not None:
        # Spread by key once, sorted once: the deduplication, the shared sequences and the
        # fold's per-key aggregate then need no shuffle and no sort of their own.
        keyed = keyed.repartition(*[col(k) for k in keys])
    keyed = keyed.withColumn(DEDUP, F.when(col(OP) == UPSERT, layout.identity())).withColumn(
        EV_HASH, F.xxhash64(col(DEDUP))
    )
    if old_state is None:
        fields = {f.name: f.dataType for f in layout.schema().fields}
        nothing = [F.lit(None).cast(fields[c]).alias(old(c)) for c in _old_columns(layout)]
        alone = keyed.select(
            "*", F.lit(False).alias(SHARED), *nothing, F.lit(None).cast("boolean").alias(OLD_EXISTS)
        )
        return _flag(with_bounds(alone, bounds, layout), layout, quarantine_late)
    # Exact duplicates: a delete is its key and sequence, an upsert also its values (and,
    # on a partial target, the columns it sets), as their hash tells, the identity the
    # state keeps for the winner too. A duplicate follows its twin in this order.
    at_sequence = Window.partitionBy(*[col(k) for k in keys], col(SEQ)).orderBy(OP, EV_HASH)
    twin = (F.lag(OP).over(at_sequence) == col(OP)) & (
        F.lag(EV_HASH).over(at_sequence) == col(EV_HASH)
    )
    # Different upserts at one key and sequence: counted (the batch's conflicts), then
    # tie-broken by the fold.
    whole = at_sequence.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    upsert_hash = F.when(col(OP) == UPSERT, col(EV_HASH))
    shared = F.min(upsert_hash).over(whole) != F.max(upsert_hash).over(whole)
    keyed = (
        keyed.withColumns(
            {SHARED: F.coalesce(shared, F.lit(False)), TWIN: F.coalesce(twin, F.lit(False))}
        )
        .where(~col(TWIN))
        .drop(TWIN)
    )
    events = with_bounds(keyed.join(_olds(old_state, layout), keys, "left"), bounds, layout)
    return _flag(events, layout, quarantine_late)


def _flag(events: DataFrame, layout: st.Layout, quarantine_late: bool) -> DataFrame:
    """``events`` (each with its key's stored state) flagged LATE or STALE."""
    late = F.lit(False)
    if quarantine_late:
        no_state = col(OLD_EXISTS).isNull()
        late = no_state & F.coalesce(col(SEQ) <= col(M_GC), F.lit(False))
        if layout.per_column_sequences:
            # A key re-created above the horizon: whether a collected delete fell between
            # an old partial update and the re-creation is unknown, so the columns it
            # would set cannot be judged (unless its own stored delete outdates it).
            late = late | (
                ~no_state
                & (col(OP) == UPSERT)
                & F.coalesce(col(SEQ) <= col(old(st.FLOOR)), F.lit(False))
                & F.coalesce(col(SEQ) > col(old(st.DEL)), F.lit(True))
            )
    newest_old = F.greatest(old(st.UPS), old(st.DEL))
    same_winner = F.lit(True) if layout.per_column_sequences else col(EV_HASH) == col(old(st.HASH))
    stale = F.coalesce(
        (col(SEQ) < newest_old)
        | (col(SEQ) == col(old(st.DEL)))
        | ((col(OP) == UPSERT) & (col(SEQ) == col(old(st.UPS))) & same_winner),
        F.lit(False),
    )
    return (
        events.withColumn(LATE, late)
        .withColumn(STALE, ~col(LATE) & stale)
        .withColumn(REASON, F.when(col(LATE), F.lit(QUARANTINE_LATE_BEYOND_HORIZON)))
    )


def _old_columns(layout: st.Layout) -> list[str]:
    """The state columns the reconcile compares the batch with."""
    columns = [st.UPS, st.DEL, st.FLOOR, st.HASH, st.LIVE]
    if layout.per_column_sequences:
        columns += [st.column_seq(v) for v in layout.value_names]
    return columns


def _olds(old_state: DataFrame, layout: st.Layout) -> DataFrame:
    """The stored state to join: keys, the compared columns as ``old(...)``, OLD_EXISTS."""
    return old_state.select(
        *[col(k) for k in layout.key_names],
        *[col(c).alias(old(c)) for c in _old_columns(layout)],
        F.lit(True).alias(OLD_EXISTS),
    )


def fold(
    events: DataFrame,
    old_state: DataFrame | None,
    bounds: DataFrame | None,
    layout: st.Layout,
    batch_id: int,
    whole_state: bool,
) -> DataFrame:
    """The new state row of every key the batch touches, flagged CHANGED where it differs
    from the stored one, with the target change and the key's event counts.
    ``whole_state``: ``old_state`` also holds keys without events (a truncate touches
    every key); else it holds the batch's keys only, or is None (sole changes: one event
    per key, nothing stored)."""
    # A change at or below the key's stored delete is dead on arrival.
    dead = F.coalesce(col(SEQ) <= col(old(st.DEL)), F.lit(False))
    # Each event carries its key's stored state (classify joined it): without keys beyond
    # the batch's, the fold takes it along instead of joining the state a second time.
    carried = [] if whole_state else [*[old(c) for c in _old_columns(layout)], OLD_EXISTS]
    per_key = _fold_batch(events, ~col(LATE) & ~dead, layout, carried, old_state is None)
    return _combine(per_key, old_state, bounds, layout, batch_id, whole_state)


def _fold_batch(
    events: DataFrame, ok: Column, layout: st.Layout, carried: list[str], sole: bool
) -> DataFrame:
    """Per key: the winning upsert (or per-column winners) and latest delete among the
    ``ok`` events, the counts of all of them, and the ``carried`` columns (the same in
    every event of a key). ``sole``: one event per key, so each aggregate is its value
    over that one event, and nothing is grouped."""
    is_upsert = ok & (col(OP) == UPSERT)

    # Each aggregate, and what it gives over a single event.
    def count(c: Column) -> tuple[Column, Column]:
        return F.count(c), F.when(c.isNotNull(), 1).otherwise(0).cast("long")

    def greatest(c: Column) -> tuple[Column, Column]:
        return F.max(c), c

    def max_by(c: Column, by: Column) -> tuple[Column, Column]:
        return F.max_by(c, by), F.when(by.isNotNull(), c)

    # Every aggregate here is a declarative one (a set per key made Spark's object
    # aggregate sort every row, twice).
    aggs = {
        N_OK: count(F.when(ok, 1)),
        N_EVENTS: count(F.lit(1)),
        N_LATE: count(F.when(col(LATE), 1)),
        N_STALE: count(F.when(col(STALE), 1)),
        B_UPS: greatest(F.when(is_upsert, col(SEQ))),
        B_DEL: greatest(F.when(ok & (col(OP) == DELETE), col(SEQ))),
        # An upsert's key and sequence are folded alike (``ok`` is the same for both).
        CONFLICT: greatest(is_upsert & col(SHARED)),
    }
    if layout.per_column_sequences:
        for f in layout.values:
            ver = F.when(
                is_upsert & col(st.set_flag(f.name)),
                F.struct(col(SEQ).alias("s"), st.comparable(f.name, f.dataType).alias("t")),
            )
            aggs[b_ver(f.name)] = greatest(ver)
            aggs[b_col(f.name)] = max_by(col(f.name), ver)
    else:
        ver = F.when(is_upsert, F.struct(col(SEQ).alias("s"), col(DEDUP).alias("t")))
        aggs[B_VER] = greatest(ver)
        aggs[B_VAL] = max_by(F.struct(*[col(v) for v in layout.value_names]), ver)
    keys = [col(k) for k in layout.key_names]
    kept = [*keys, *[col(c) for c in carried]]
    if sole:
        return events.select(*kept, *[one.alias(name) for name, (_, one) in aggs.items()])
    # Over a window of the key, not grouped: rows already spread and sorted by key need
    # no sort, and a struct-valued aggregate would make Spark group with its slower sort
    # aggregate, twice (partial and final). Every row of a key then carries the key's
    # result: the first one is kept.
    per_key = Window.partitionBy(*keys)
    return (
        events.select(
            *kept,
            *[agg.over(per_key).alias(name) for name, (agg, _) in aggs.items()],
            F.row_number().over(per_key.orderBy(SEQ)).alias(ROW),
        )
        .where(col(ROW) == 1)
        .drop(ROW)
    )


def _combine(
    per_key: DataFrame,
    old_state: DataFrame | None,
    bounds: DataFrame | None,
    layout: st.Layout,
    batch_id: int,
    whole_state: bool,
) -> DataFrame:
    """Fold the batch's per-key result into the old state: carried along in ``per_key``,
    or (``whole_state``: keys without events too) joined with it."""
    keys, values = layout.key_names, layout.value_names
    seq_columns = _old_columns(layout)
    if whole_state:
        per_key = per_key.join(_olds(old_state, layout), keys, "full")
    df = with_bounds(per_key, bounds, layout)
    old_exists = F.coalesce(col(OLD_EXISTS), F.lit(False))
    old_live = F.coalesce(col(old(st.LIVE)), F.lit(False))

    dele = F.greatest(old(st.DEL), B_DEL, NEW_TRUNC)
    ups = F.greatest(old(st.UPS), B_UPS)
    live = ups.isNotNull() & F.coalesce(ups > dele, F.lit(True))
    out: dict[str, Column] = {st.KIND: F.lit(st.STATE_ROW)}
    out |= {k: col(k) for k in keys}
    out[st.UPS] = ups
    out[st.DEL] = dele
    out[st.FLOOR] = F.when(old_exists, col(old(st.FLOOR))).otherwise(col(M_GC))
    instructions: dict[str, Column] = {}
    conflict = F.coalesce(col(CONFLICT), F.lit(False))

    if layout.per_column_sequences:
        ties: list[Column] = []
        for f in layout.values:
            new_ver, old_seq = col(b_ver(f.name)), col(old(st.column_seq(f.name)))
            taken = new_ver.isNotNull() & (old_seq.isNull() | (new_ver["s"] > old_seq))
            tied = F.coalesce(new_ver["s"] == old_seq, F.lit(False))
            seq = F.when(taken, new_ver["s"]).otherwise(old_seq)
            wiped = F.coalesce(seq <= dele, F.lit(False))  # a later delete erased it
            out[st.column_seq(f.name)] = F.when(~wiped, seq)
            instructions[f.name] = F.when(~wiped & (taken | tied), col(b_col(f.name)))
            instructions[take(f.name)] = taken & ~wiped
            instructions[tie(f.name)] = tied & ~wiped
            instructions[wipe(f.name)] = wiped
            ties.append(tied & ~wiped)
        out[st.HASH] = F.lit(None).cast("long")
        any_tie = reduce(lambda a, b: a | b, ties, F.lit(False))
        upsert = None  # decided below, from whether the state changed
    else:
        b_seq = col(B_VER)["s"]
        b_hash = F.xxhash64(col(B_VER)["t"])
        taken = b_seq.isNotNull() & (col(old(st.UPS)).isNull() | (b_seq > col(old(st.UPS))))
        tied = F.coalesce((b_seq == col(old(st.UPS))) & (b_hash != col(old(st.HASH))), F.lit(False))
        out[st.HASH] = F.when(taken | tied, b_hash).otherwise(col(old(st.HASH)))
        instructions |= {v: col(B_VAL)[v] for v in values}
        instructions[TIE] = tied & ~taken
        conflict = conflict | tied
        upsert = live & (taken | tied)

    out[st.LIVE] = live
    out[st.BATCH] = F.lit(batch_id).cast("long")
    out[st.UPDATED_AT] = F.current_timestamp()

    compared = [c for c in seq_columns]
    fields = {f.name: f.dataType for f in layout.schema().fields}

    def same_as_old(name: str) -> Column:
        return out[name].cast(fields[name]).eqNullSafe(col(old(name)))

    unchanged = reduce(lambda a, b: a & b, [same_as_old(c) for c in compared])
    # A key without state changes once an event of it is folded (not all were late/dead).
    changed = F.when(old_exists, ~unchanged).otherwise(F.coalesce(col(N_OK), F.lit(0)) > 0)
    if upsert is None:
        upsert = live & (changed | any_tie)
    action = F.when(old_live & ~live, F.lit(ACT_DELETE)).when(upsert, F.lit(ACT_UPSERT))

    counts = [F.coalesce(col(n), F.lit(0)).alias(n) for n in (N_OK, N_EVENTS, N_LATE, N_STALE)]
    return df.select(
        *[c.alias(name) for name, c in out.items()],
        *[c.alias(name) for name, c in instructions.items()],
        changed.alias(CHANGED),
        action.alias(ACTION),
        *counts,
        old_exists.alias(OLD_EXISTS),
        old_live.alias(OLD_LIVE),
        conflict.alias(CONFLICT),
    )


def _group_live(group: str) -> Column:
    """Whether ``group``'s greatest upsert is above its latest delete."""
    ups, dele = col(st.group_ups(group)), col(st.group_del(group))
    return ups.isNotNull() & F.coalesce(ups > dele, F.lit(True))


def group_view(old_state: DataFrame, full: st.Layout) -> DataFrame:
    """The stored state as the batch's group sees it (sequence groups): its own
    sequences under the names the fold reads, its liveness alone; no horizon (a target
    with groups collects no tombstones and takes no truncate)."""
    group, own = full.group, full.group_layout()
    return old_state.select(
        *[col(k) for k in full.key_names],
        col(st.group_ups(group)).alias(st.UPS),
        col(st.group_del(group)).alias(st.DEL),
        F.lit(None).cast(full.sequence).alias(st.FLOOR),
        col(st.HASH),
        _group_live(group).alias(st.LIVE),
        *[col(st.column_seq(v)) for v in own.value_names],
    )


def regroup(touched: DataFrame, old_state: DataFrame, full: st.Layout) -> DataFrame:
    """The batch group's fold back into the whole state row (sequence groups): the other
    groups' sequences as stored; the key is live while any group is (its greatest
    upsert above its latest delete), so the target's action is decided on that."""
    group, own = full.group, set(full.group_layout().value_names)
    others = [g for g, _ in full.group_types if g != group]
    other_live = reduce(lambda a, b: a | b, [_group_live(g) for g in others], F.lit(False))
    kept = [c for g in others for c in (st.group_ups(g), st.group_del(g))]
    kept += [st.column_seq(v) for v in full.value_names if v not in own]
    rest = old_state.select(
        *[col(k) for k in full.key_names], *[col(c) for c in kept], other_live.alias(OTHER_LIVE)
    )
    joined = touched.drop(*[c for c in kept if c in touched.columns]).join(
        rest, full.key_names, "left"
    )
    others_live = F.coalesce(col(OTHER_LIVE), F.lit(False))
    live, old_live = col(st.LIVE) | others_live, col(OLD_LIVE) | others_live
    ties = reduce(lambda a, b: a | b, [col(tie(v)) for v in own], F.lit(False))
    action = F.when(old_live & ~live, F.lit(ACT_DELETE)).when(
        live & (col(CHANGED) | ties), F.lit(ACT_UPSERT)
    )
    null = F.lit(None).cast("long")
    return joined.withColumns(
        {
            st.group_ups(group): col(st.UPS),
            st.group_del(group): col(st.DEL),
            ACTION: action,
            st.LIVE: live,
            OLD_LIVE: old_live,
        }
    ).withColumns({st.UPS: null, st.DEL: null, st.FLOOR: null})
