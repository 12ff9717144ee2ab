"""SCD type 2's history: the versions the MERGE writes for the keys a batch touches.

A version is a function of a key's whole log, and splitting history for a late change
needs what the row looked like at that sequence, which in-place updates of untracked
columns and partial updates would otherwise lose; so for a key a batch touches out of
order (or more than once), the history is recomputed from the key's log with window
functions. The log describes the target (its new rows reach the state table through the
redo of :mod:`autocdc.engine.commit`, after the target committed), so the versions the
target holds are the history of the old log: only versions that differ from those are
written, or deleted when gone (one MERGE: :mod:`~autocdc.engine.scd2.merge`).

Most keys of a batch take one change that comes after everything they logged. Their
history only continues: the open version is closed or updated in place, and a new one
opens, which the key's last logged change and the new one decide alone (no windows over
the log). Both kinds of key share one shuffle and one MERGE.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from autocdc.engine import bound as kb
from autocdc.engine import state as st
from autocdc.engine import tables
from autocdc.engine.scd2.reconcile import APPEND, FRESH, LOGGED, NEW, SIMPLE
from autocdc.engine.spec import END_AT, START_AT
from autocdc.engine.tables import col

RANK, SEG, START = "__autocdc_rank", "__autocdc_seg", "__autocdc_start"
VERSION, NEXT, VALUES = "__autocdc_version", "__autocdc_next", "__autocdc_vals"
HELD, GEN, LAST, EVENT = "__autocdc_held", "__autocdc_gen", "__autocdc_last", "__autocdc_event"
IN_PLACE, HELD_OPEN = "__autocdc_in_place", "__autocdc_held_open"
# What a MERGE row does to the version it addresses: deletes it (GONE), or sets only its
# end (ENDS); else it rewrites or opens it.
GONE, ENDS = "__autocdc_gone", "__autocdc_ends"


def _sets(name: str) -> Column:
    """Whether a logged upsert set value column ``name`` (rows without a list: non-NULL)."""
    return F.coalesce(F.array_contains(col(st.SETS), F.lit(name)), col(name).isNotNull())


def held_values(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    logged: DataFrame,
    keys_bound: kb.KeyBound,
    held: int,
) -> DataFrame:
    """``logged`` (log rows of hashes, see :func:`~autocdc.engine.scd2.reconcile.log_rows`)
    with each upsert's values: those of the target's version holding its sequence. Exact
    where every column is tracked, as a version's changes all hold its values; an upsert
    at a sequence no version holds (one deleted at its own sequence) is left out, as it
    shapes no version, now or after any later change. ``held``: how many upserts
    ``logged`` holds (their keys, a semi-join, broadcast when they fit; the target is read
    only within ``keys_bound``, theirs, and only if there are any: on a target clustered
    by key, only the files that can hold them).

    The key's versions and its upserts in one sequence order: each upsert takes the
    version that starts last at or before it, unless that one ended by then. Linear in a
    key's rows: a join on the key and the range paired each upsert with every version of
    its key (a key with many versions, many times over)."""
    keys, values = layout.key_names, layout.value_names
    deletes = logged.where(~col(st.LIVE))  # they hold no values
    if not held:
        return deletes
    bare = logged.drop(*values)
    upserts = bare.where(col(st.LIVE))
    key_cols = [col(k) for k in keys]
    versions = kb.of_keys(
        tables.read(spark, target), keys_bound, keys, upserts.select(*key_cols), held
    )
    rest = [c for c in bare.columns if c not in keys]
    holder = F.struct(*[col(v) for v in values], col(END_AT).alias(END_AT))
    both = versions.select(
        *key_cols, col(START_AT).alias(START), F.lit(0).alias(RANK), holder.alias(HELD)
    ).unionByName(
        upserts.select(
            *key_cols,
            col(st.UPS).alias(START),
            F.lit(1).alias(RANK),
            F.struct(*[col(c) for c in rest]).alias(LAST),
        ),
        allowMissingColumns=True,
    )
    upto = (
        Window.partitionBy(*key_cols)
        .orderBy(START, RANK)
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    found = both.select(
        *key_cols, RANK, LAST, F.last(HELD, ignorenulls=True).over(upto).alias(HELD)
    )
    ends = col(HELD)[END_AT]
    within = (col(RANK) == 1) & col(HELD).isNotNull()
    filled = found.where(within & (ends.isNull() | (col(LAST)[st.UPS] < ends))).select(
        *key_cols, *[col(LAST)[c].alias(c) for c in rest], *[col(HELD)[v].alias(v) for v in values]
    )
    return filled.unionByName(deletes)


def history(
    log: DataFrame,
    layout: st.Layout,
    tracked: list[str],
    by: list[str],
    hashed: bool = False,
    in_place: bool = False,
) -> DataFrame:
    """Every version of each key and ``by`` group in ``log``: keys, ``by``, values,
    ``__START_AT``, ``__END_AT``.

    Every step groups by the keys and more, so a ``log`` spread by the keys alone is
    never spread again: one shuffle for the whole history (see :func:`changed`). Each step
    is linear in a key's rows, so a key with many changes costs what many keys do.
    ``hashed``: upserts are compared by their ``HASH`` (every column tracked), as some
    rows of ``log`` carry no values. ``in_place``: a column ``IN_PLACE`` tells whether a
    version's values changed after its first row (an update in place)."""
    keys, values = layout.key_names, layout.value_names
    key_cols = [col(k) for k in [*keys, *by]]
    is_upsert = col(st.LIVE)
    flags = {v: st.set_flag(v) for v in values}
    if layout.partial:  # equal-sequence upserts merge per column: the greatest value set
        merged = [
            agg
            for f in layout.values
            for agg in (
                F.max_by(
                    col(f.name),
                    F.when(is_upsert & _sets(f.name), F.struct(st.comparable(f.name, f.dataType))),
                ).alias(f.name),
                F.coalesce(F.max(is_upsert & _sets(f.name)), F.lit(False)).alias(flags[f.name]),
            )
        ]
    else:  # equal-sequence upserts: the greatest row wins
        carried = [*values, st.HASH] if hashed else values
        best = F.max_by(F.struct(*[col(v) for v in carried]), layout.tie())
        merged = [best.alias(VALUES)]
    # Upserts and deletes at one sequence stay apart (RANK: the upsert first); a delete
    # carries no values.
    rows = log.groupBy(*key_cols, st.UPS, (~is_upsert).cast("int").alias(RANK)).agg(*merged)
    is_delete = col(RANK) == 1
    if not layout.partial:
        rows = rows.select(
            *key_cols,
            st.UPS,
            RANK,
            *[F.when(~is_delete, col(VALUES)[v]).alias(v) for v in carried],
        )

    order = Window.partitionBy(*key_cols).orderBy(st.UPS, RANK)
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    if layout.partial:  # a column not set keeps the value last set since the last delete
        rows = rows.withColumn(SEG, F.sum(is_delete.cast("int")).over(upto))
        in_segment = (
            Window.partitionBy(*key_cols, SEG)
            .orderBy(st.UPS, RANK)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        for v, flag in flags.items():
            # In a struct, so that a column set to NULL counts as set.
            last_set = F.last(F.when(col(flag), F.struct(col(v).alias("v"))), ignorenulls=True)
            rows = rows.withColumn(v, last_set.over(in_segment)["v"])

    fields = {f.name: f.dataType for f in layout.values}
    tracked_values = (
        F.struct(col(st.HASH))
        if hashed
        else F.struct(*[st.comparable(c, fields[c]) for c in tracked if c in fields])
    )
    # Two window passes over the key's rows, each linear in them: the lags, then the
    # running sum and the leads (four when ``opens`` was spelt out twice and each column
    # had a pass). A version's upserts are consecutive rows, so it ends at the row after
    # its last upsert when that row is a boundary (a delete or the next version's start).
    # A frame from the next row to the partition's end is aggregated anew for every row:
    # quadratic in a key's changes, which a key with many versions in one batch never
    # got through.
    opens = ~is_delete & (
        (F.coalesce(F.lag(RANK).over(order), F.lit(1)) == 1)
        | ~tracked_values.eqNullSafe(F.lag(tracked_values).over(order))
    )
    boundary = col(START) | is_delete
    rows = rows.withColumn(START, opens).select(
        "*",
        F.sum(col(START).cast("int")).over(upto).alias(VERSION),
        F.when(F.lead(boundary).over(order), F.lead(st.UPS).over(order)).alias(NEXT),
    )
    value_struct = F.struct(*[col(v) for v in values])
    extra = []
    if in_place:
        compared = F.struct(*[st.comparable(v, fields[v]) for v in values])
        changed = ~F.max_by(compared, col(st.UPS)).eqNullSafe(F.min_by(compared, col(st.UPS)))
        extra = [changed.alias(IN_PLACE)]
    versions = (
        rows.where(~is_delete)
        .groupBy(*key_cols, VERSION)
        .agg(
            F.min(st.UPS).alias(START_AT),
            F.max(col(NEXT)).alias(END_AT),
            F.max_by(value_struct, col(st.UPS)).alias(VALUES),
            *extra,
        )
    )
    return versions.where(F.coalesce(col(START_AT) != col(END_AT), F.lit(True))).select(
        *key_cols,
        *[col(VALUES)[v].alias(v) for v in values],
        START_AT,
        END_AT,
        *([IN_PLACE] if in_place else []),
    )


def opened(layout: st.Layout, rows: DataFrame, types: dict[str, DataType]) -> DataFrame:
    """The versions of keys that logged nothing and take one new change each (``rows``):
    an upsert opens its key's first version, a delete writes nothing. A plain projection:
    the general expression of :func:`_continued` is costly over a large initial load."""
    opened = rows.where(col(st.LIVE)).withColumns(
        {START_AT: col(st.UPS), END_AT: F.lit(None).cast(layout.sequence)}
    )
    return opened.select(*[col(c).cast(t).alias(c) for c, t in types.items()])


def _continued(
    layout: st.Layout,
    tracked: list[str],
    rows: DataFrame,
    types: dict[str, DataType],
) -> DataFrame:
    """The MERGE rows of keys whose one new change comes after all they logged (most keys
    of a batch), from the key's last logged change and the new one alone, no history:
    the open version is closed at the change (a delete, or new tracked values: ``ENDS``,
    only its end is set), its values replaced in place (new untracked values), and an
    upsert that opens a version is inserted. A row whose ``__START_AT`` is NULL matches the
    key's open version (see the MERGE's condition,
    :func:`~autocdc.engine.scd2.merge.addressed`). With ``log_hashes`` the log's hashes
    tell whether the values changed. Not for a partial target, whose columns carry over."""
    keys, values = layout.key_names, layout.value_names
    fields = {f.name: f.dataType for f in layout.values}
    is_new = col(FRESH)
    row = F.struct(
        col(st.LIVE).alias(st.LIVE),
        col(st.UPS).alias(st.UPS),
        col(st.HASH).alias(st.HASH),
        *[col(v) for v in values],
    )
    last_order = F.struct(col(st.UPS), (~col(st.LIVE)).cast("int"), layout.tie())
    # Of a key's logged rows only those at its last logged sequence can be the last.
    rows = rows.where(is_new | (col(st.UPS) == col(LOGGED)))
    per_key = rows.groupBy(*[col(k) for k in keys]).agg(
        F.max_by(row, F.when(~is_new, last_order)).alias(LAST),
        F.max_by(row, F.when(is_new, F.lit(1))).alias(EVENT),
    )
    last, event = col(LAST), col(EVENT)

    def same(names: list[str]) -> Column:
        def of(c: Column) -> Column:
            return F.struct(*[st.comparable(n, fields[n], c[n]).alias(n) for n in names])

        return of(event).eqNullSafe(of(last))

    live = F.coalesce(last[st.LIVE], F.lit(False))
    if layout.log_hashes:  # every column tracked: new values open a version
        kept, replaced = event[st.HASH].eqNullSafe(last[st.HASH]), F.lit(False)
    else:
        kept, replaced = same([c for c in tracked if c in fields]), ~same(values)
    upsert = event[st.LIVE]
    no_start = F.lit(None).cast(layout.sequence)

    def version(start: Column, source: Column, end: Column, ends: bool = False) -> Column:
        return F.struct(
            start.alias(START_AT),
            *[source[v].alias(v) for v in values],
            end.alias(END_AT),
            F.lit(ends).alias(ENDS),
        )

    # Up to three rows a key, NULL where none is written: filtered after the explode, as
    # ``array_compact`` (a lambda) runs interpreted, the arrays' structs with it.
    written = F.array(
        F.when(live & (~upsert | ~kept), version(no_start, last, event[st.UPS], ends=True)),
        F.when(live & upsert & kept & replaced, version(no_start, event, no_start)),
        F.when(upsert & (~live | ~kept), version(event[st.UPS], event, no_start)),
    )
    out = per_key.select(*[col(k) for k in keys], F.explode(written).alias(VALUES))
    return out.where(col(VALUES).isNotNull()).select(
        *[col(k) for k in keys],
        *[col(VALUES)[c].cast(t).alias(c) for c, t in types.items() if c not in keys],
        F.lit(False).alias(GONE),
        col(VALUES)[ENDS].alias(ENDS),
    )


def _appended(
    layout: st.Layout,
    tracked: list[str],
    rows: DataFrame,
    types: dict[str, DataType],
) -> DataFrame:
    """The MERGE rows of keys whose new changes (more than one) all come after all they
    logged, as a database's log sends a busy row's updates: the history of the key's
    last logged change and its new changes alone, so a batch costs what it brings, not
    what the key holds. A version starting at the last logged sequence continues the
    open version: it is ended (only its end set) or, with new untracked values, updated
    in place, its ``__START_AT`` NULL (see the MERGE's condition,
    :func:`~autocdc.engine.scd2.merge.addressed`); the others are new. With ``log_hashes``
    every column is tracked, so the hashes tell versions apart and the open version's
    values never change in place. Not for a partial target."""
    keys, values = layout.key_names, layout.value_names
    hashed = layout.log_hashes
    seeded = rows.where(col(FRESH) | (col(st.UPS) == col(LOGGED)))
    versions = history(seeded, layout, tracked, [LOGGED], hashed=hashed, in_place=not hashed)
    continues = col(START_AT).eqNullSafe(col(LOGGED))
    in_place = F.lit(False) if hashed else col(IN_PLACE)
    written = versions.where(~continues | col(END_AT).isNotNull() | in_place)
    no_start = F.lit(None).cast(layout.sequence)
    return written.select(
        *[col(k) for k in keys],
        F.when(continues, no_start).otherwise(col(START_AT)).cast(types[START_AT]).alias(START_AT),
        *[col(v).cast(types[v]).alias(v) for v in values],
        col(END_AT).cast(types[END_AT]).alias(END_AT),
        F.lit(False).alias(GONE),
        (continues & ~in_place).alias(ENDS),
    )


def target_types(layout: st.Layout) -> dict[str, DataType]:
    """The target's columns and their types."""
    types = {f.name: f.dataType for f in [*layout.keys, *layout.values]}
    return types | {START_AT: layout.sequence, END_AT: layout.sequence}


def changed(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    tracked: list[str],
    rows: DataFrame,
    sole: bool,
    held: int,
    held_bound: kb.KeyBound,
) -> DataFrame:
    """The MERGE's rows: what turns the touched keys' history as their log gives it (what
    the target holds: the log describes the target) into the one their log and new
    changes give (``rows``: both, spread by key, marked by
    :func:`~autocdc.engine.scd2.reconcile.marked`): versions that changed or are new,
    written, and versions that are gone, deleted (``GONE``); the rest are not touched.
    With ``log_hashes``, the rebuilt keys' ``held`` logged upserts read their values from
    the target first, within ``held_bound``, their keys'. ``sole``: ``rows`` are only new
    changes, one per key, and nothing is logged."""
    keys = layout.key_names
    types = target_types(layout)
    if sole:  # every key continues from nothing
        return opened(layout, rows, types).withColumns({GONE: F.lit(False), ENDS: F.lit(False)})
    # ``rows`` is spread by key already. A key whose new changes come after its log
    # continues its history (``_continued``, ``_appended``); any other is rebuilt: both
    # histories in one pass, the held one (GEN 0: its log) and the new one (GEN 1: its
    # log and its new changes), each version paired with the other's at its (keys,
    # start) by a grouping, not by a full join of two histories.
    rest = {c: t for c, t in types.items() if c not in (*keys, START_AT)}
    compared = F.struct(*[st.comparable(c, t).alias(c) for c, t in rest.items()])
    key_cols = [col(k) for k in keys]
    is_new = col(FRESH)
    rebuilding = rows.where(~col(SIMPLE) & ~col(APPEND))
    if layout.log_hashes:
        logged = held_values(spark, target, layout, rebuilding.where(~is_new), held_bound, held)
        rebuilding = logged.unionByName(rebuilding.where(is_new))
    gens = F.when(is_new, F.array(F.lit(1))).otherwise(F.array(F.lit(0), F.lit(1)))
    both = rebuilding.select("*", F.explode(gens).alias(GEN))
    fresh = col(GEN) == 1
    pairs = (
        history(both, layout, tracked, [GEN])
        .groupBy(*key_cols, START_AT)
        .agg(
            F.max_by(F.struct(*[col(c) for c in rest]), col(GEN)).alias(VALUES),
            F.max(F.when(fresh, compared)).alias(NEW),
            F.max(F.when(~fresh, compared)).alias(HELD),
            F.max(F.when(~fresh, col(END_AT).isNull())).alias(HELD_OPEN),
        )
    )
    gone = col(NEW).isNull()
    # The held open version is addressed as the open one (see the MERGE's condition).
    start = F.when(col(HELD_OPEN), F.lit(None).cast(types[START_AT])).otherwise(col(START_AT))
    rebuilt = pairs.where(gone | ~col(NEW).eqNullSafe(col(HELD))).select(
        *key_cols,
        start.alias(START_AT),
        *[col(VALUES)[c].alias(c) for c in rest],
        gone.alias(GONE),
        F.lit(False).alias(ENDS),
    )
    if layout.partial:
        return rebuilt
    continued = _continued(layout, tracked, rows.where(col(SIMPLE)), types)
    appended = _appended(layout, tracked, rows.where(col(APPEND)), types)
    return rebuilt.unionByName(continued).unionByName(appended)
