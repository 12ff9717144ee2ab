"""SCD type 2: every version of every key, exact under out-of-order arrival.

The state table is the key's change log (deduplicated upserts and deletes, one row each,
``__autocdc_ups`` holding the change's sequence and ``__autocdc_live`` true for an
upsert). A version is a function of a key's whole log, and splitting history for a late
change needs what the row looked like at that sequence, which in-place updates of
untracked columns and partial updates would otherwise lose; so for a key a batch
touches out of order (or more than once), the history is recomputed from the key's log
with window functions. The log describes the target (its new rows reach the state table
through the redo of :mod:`autocdc.engine.commit`, after the target committed), so the
versions the target holds are the history of the old log: only versions that differ from
those are written, or deleted when gone (one MERGE).

Where every column is tracked and upserts are whole rows (``Layout.log_hashes``, fixed
when the target is created), no change is absorbed by a version whose values it does not
hold, so the log keeps a hash of an upsert's values (a replay is told from a new change
by it) and not the values: a rebuilt key reads its logged upserts' values from the
target's versions (:func:`held_values`). Otherwise the log keeps the values, and the
target is read only by the MERGE.

Most keys of a batch take one change that comes after everything they logged. Their
history only continues: the open version is closed or updated in place, and a new one
opens, which the key's last logged change and the new one decide alone (no windows over
the log). Both kinds of key share one shuffle and one MERGE.

On a partial target each logged upsert lists the value columns it set (``SETS``); a
column it does not set carries the value of the version it continues, whichever flow set
that value, and NULL after a delete. A row logged with no list (by ``ignore_null_updates``
before the list was kept) set its non-NULL columns.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField

from autocdc.engine import bound as kb
from autocdc.engine import sizing, tables
from autocdc.engine import state as st
from autocdc.engine.batch import Batch, Plan, into_empty_target, sole_changes
from autocdc.engine.checkpoint import materialized
from autocdc.engine.spec import END_AT, START_AT
from autocdc.engine.stage import OP, SEQ, TRUNCATE, UPSERT, col

EVENT_ROW = st.EVENT_ROW
RANK, SEG, START = "__autocdc_rank", "__autocdc_seg", "__autocdc_start"
VERSION, NEXT, VALUES, GONE = (
    "__autocdc_version",
    "__autocdc_next",
    "__autocdc_vals",
    "__autocdc_gone",
)
NEW, HELD, GEN, REPEAT = "__autocdc_new", "__autocdc_held", "__autocdc_gen", "__autocdc_repeat"
FRESH, SIMPLE, TOUCHED = "__autocdc_fresh", "__autocdc_simple", "__autocdc_touched"
LAST, EVENT, LOGGED = "__autocdc_last", "__autocdc_event", "__autocdc_logged"
ENDS = "__autocdc_ends"
APPEND, IN_PLACE, HELD_OPEN = "__autocdc_append", "__autocdc_in_place", "__autocdc_held_open"
HELD_BOUND = "held"  # the prefix of the rebuilt keys' bound (see :func:`plan`)


def _sets(name: str) -> Column:
    """Whether a logged upsert set value column ``name`` (rows without a list: non-NULL)."""
    return F.coalesce(F.array_contains(col(st.SETS), F.lit(name)), col(name).isNotNull())


def event_rows(changes: DataFrame, layout: st.Layout, batch_id: int) -> DataFrame:
    """The batch's keyed changes as change-log rows (a delete carries no values; on a
    partial target an upsert lists the columns it sets, and holds only their values; with
    ``log_hashes`` an upsert also carries the hash the log keeps, see :func:`log_rows`), a
    change that repeats another still there (:func:`plan` tells them apart)."""
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
            F.lit(EVENT_ROW).alias(st.KIND),
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


def held_values(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    logged: DataFrame,
    keys_bound: kb.KeyBound,
    held: int,
) -> DataFrame:
    """``logged`` (log rows of hashes, see :func:`log_rows`) with each upsert's values:
    those of the target's version holding its sequence. Exact where every column is
    tracked, as a version's changes all hold its values; an upsert at a sequence no version
    holds (one deleted at its own sequence) is left out, as it shapes no version, now or
    after any later change. ``held``: how many upserts ``logged`` holds (their keys, a
    semi-join, broadcast when they fit; the target is read only within ``keys_bound``,
    theirs, and only if there are any: on a target clustered by key, only the files that
    can hold them).

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
    never spread again: one shuffle for the whole history (see :func:`merge`). Each step
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


def _opened(layout: st.Layout, rows: DataFrame, types: dict[str, DataType]) -> DataFrame:
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
    key's open version (see :func:`merge`'s condition). With ``log_hashes`` the log's
    hashes tell whether the values changed. Not for a partial target, whose columns carry
    over."""
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
    # ``array_compact`` (a lambda) runs interpreted, the arrays' structs with it: 160k keys
    # took 1.2-2.0 s instead of 1.0 s (its input's 0.5-0.8 s included).
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
    in place, its ``__START_AT`` NULL (see :func:`merge`'s condition); the others are
    new. With ``log_hashes`` every column is tracked, so the hashes tell versions apart
    and the open version's values never change in place. Not for a partial target."""
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


def _target_types(layout: st.Layout) -> dict[str, DataType]:
    """The target's columns and their types."""
    types = {f.name: f.dataType for f in [*layout.keys, *layout.values]}
    return types | {START_AT: layout.sequence, END_AT: layout.sequence}


def merge(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    tracked: list[str],
    rows: DataFrame,
    keys_bound: kb.KeyBound,
    sole: bool,
    held: int,
    held_bound: kb.KeyBound,
) -> tuple[Callable[[], DataFrame], Callable[[DataFrame], DataFrame]]:
    """The MERGE that turns the touched keys' history as their log gives it (what the
    target holds: the log describes the target) into the one their log and new changes
    give (``rows``: both, spread by key, the changes marked ``FRESH``, the rows of a key
    that continues its history with one change ``SIMPLE``, with several ``APPEND``):
    versions that changed or are new are written,
    versions that are gone deleted, the rest not touched.
    Nothing runs until called, and the target is read within ``keys_bound`` (the touched
    keys'; with ``log_hashes``, the rebuilt keys' ``held`` logged upserts read their
    values from it first, within ``held_bound``, their keys'). ``sole``: ``rows`` are only
    new changes, one per key, and nothing is logged (not spread: nothing is grouped).
    Returns the MERGE and its merge-on-read (:func:`preview`: what it makes of a read of
    the target, nothing written)."""
    keys, values = layout.key_names, layout.value_names
    types = _target_types(layout)
    columns = list(types)

    def changed() -> DataFrame:
        if sole:  # every key continues from nothing
            return _opened(layout, rows, types).withColumns(
                {GONE: F.lit(False), ENDS: F.lit(False)}
            )
        # ``rows`` is spread by key already. A key whose new changes come after its log
        # continues its history (``_continued``, ``_appended``); any other is rebuilt:
        # both histories
        # in one pass, the held one (GEN 0: its log) and the new one (GEN 1: its log and
        # its new changes), each version paired with the other's at its (keys, start) by
        # a grouping, not a join (two histories and a full join were 8.7 s of a
        # 100k-change batch into 1M rows).
        rest = {c: t for c, t in types.items() if c not in (*keys, START_AT)}
        compared = F.struct(*[st.comparable(c, t).alias(c) for c, t in rest.items()])
        key_cols = [col(k) for k in keys]
        is_new = col(FRESH)
        rebuilding = rows.where(~col(SIMPLE) & ~col(APPEND))
        if layout.log_hashes:
            logged = held_values(spark, target, layout, rebuilding.where(~is_new), held_bound, held)
            rebuilding = logged.unionByName(rebuilding.where(is_new))
        both = rebuilding.select(
            "*",
            F.explode(
                F.when(is_new, F.array(F.lit(1))).otherwise(F.array(F.lit(0), F.lit(1)))
            ).alias(GEN),
        )
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

    def run() -> DataFrame:
        # Materialized once: MERGE evaluates its source twice (merge.materializeSource=none).
        # Estimated at the size of all under it, it was joined with the target's rows by
        # shuffling them all, so it is counted on the way and broadcast when it fits (see
        # ``sizing``): 100k changes into 1M rows took 0.89-1.0x the time. Not under a
        # listed bound, which leaves few target rows to shuffle: the broadcast is a job
        # more, and 100-change batches took 0.97-1.0x.
        written = [StructField(c, t) for c, t in types.items()]
        source, row = materialized(
            changed(),
            [F.count(F.lit(1)).alias("rows"), F.sum(sizing.row_bytes(written)).alias("bytes")],
        )
        if not keys_bound.lists:
            source = sizing.small(source, row["rows"], row["bytes"])
        q = tables.ident
        # A source row addresses the version starting at its ``__START_AT``, or with none
        # the key's open version. Said as one null-safe equality, the join is on the keys
        # and the start: said as "equal starts, or no start and an open version", it was
        # on the keys alone, every version of a key paired with every row of it (a key
        # with many versions, many times over).
        on = kb.on_keys(keys, keys_bound) & _addressed(sole)
        return (
            tables.delta_table(spark, target)
            .alias("t")
            .merge(source.alias("s"), on)
            .whenMatchedDelete(condition=f"s.{GONE}")
            .whenMatchedUpdate(condition=f"s.{ENDS}", set={q(END_AT): f"s.{q(END_AT)}"})
            .whenMatchedUpdate(
                condition=f"NOT s.{GONE}", set={q(c): f"s.{q(c)}" for c in [*values, END_AT]}
            )
            .whenNotMatchedInsert(
                condition=f"NOT s.{GONE} AND s.{q(START_AT)} IS NOT NULL",
                values={q(c): f"s.{q(c)}" for c in columns},
            )
            .execute()
        )

    def read(target: DataFrame) -> DataFrame:
        return preview(layout, target, changed().localCheckpoint(), sole)

    return run, read


def _addressed(sole: bool) -> Column:
    """The MERGE's condition beyond the keys: the target version ``t`` that source row
    ``s`` addresses."""
    start = col(START_AT, "s")
    if sole:  # no row addresses an open version; an adopted target's open version
        return col(START_AT, "t") == start  # is matched by its start
    open_start = F.when(col(END_AT, "t").isNotNull(), col(START_AT, "t"))
    return start.eqNullSafe(open_start)


IN_T, IN_S = "__autocdc_in_t", "__autocdc_in_s"


def preview(layout: st.Layout, target: DataFrame, source: DataFrame, sole: bool) -> DataFrame:
    """What :func:`merge`'s MERGE of ``source`` makes of ``target`` (a read of the target),
    nothing written, clause by clause: a matched version is deleted (``GONE``), ended
    (``ENDS``: only ``__END_AT``) or rewritten; an unmatched source row opens a version.
    Only the keys ``source`` touches are joined; the other rows pass as they are."""
    keys = layout.key_names
    touched = F.broadcast(source.select(*[col(k) for k in keys]).distinct())
    kept = target.join(touched, keys, "left_anti")
    held = target.join(touched, keys, "left_semi").withColumn(IN_T, F.lit(True))
    new = source.withColumn(IN_S, F.lit(True))
    on = kb.on_keys(keys, kb.KeyBound(())) & _addressed(sole)
    both = held.alias("t").join(new.alias("s"), on, "full")
    in_t, in_s = col(IN_T, "t").isNotNull(), col(IN_S, "s").isNotNull()
    gone, ends = F.coalesce(col(GONE, "s"), F.lit(False)), F.coalesce(col(ENDS, "s"), F.lit(False))
    rewritten = in_t & in_s & ~ends

    def pick(c: str) -> Column:
        if c in keys or c == START_AT:
            return F.when(in_t, col(c, "t")).otherwise(col(c, "s"))
        if c == END_AT:
            return F.when(in_s, col(c, "s")).otherwise(col(c, "t"))
        return F.when(~in_t | rewritten, col(c, "s")).otherwise(col(c, "t"))

    stays = F.when(in_t, ~in_s | ~gone).otherwise(~gone & col(START_AT, "s").isNotNull())
    changed = both.where(stays).select(*[pick(c).alias(c) for c in target.columns])
    return kept.unionByName(changed)


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


def plan(batch: Batch) -> Plan:
    """Log the batch's new changes; continue or rebuild the touched keys' history.

    One shuffle by key for the whole batch: the log of the batch's keys and its changes
    side by side, materialized once. A change is new unless its key logged the same
    change; only keys with a new change reach the MERGE."""
    spark, layout = batch.spark, batch.layout
    keys = layout.key_names
    key_cols = [col(k) for k in keys]
    # Nothing logged and a key per change (an initial load): every change is new, and
    # each key only opens its history (a partial target's always takes the general path).
    sole = not layout.partial and sole_changes(batch)
    events = event_rows(batch.staged.changes, layout, batch.batch_id)
    fresh, new_event = col(FRESH), col(NEW)
    load = sole and into_empty_target(batch)
    reads_held = layout.log_hashes and not sole  # a rebuilt key's logged values: the target
    if sole:
        flags = [F.lit(True).alias(c) for c in (FRESH, NEW, TOUCHED)] + [F.lit(False).alias(REPEAT)]
        rows = events.select("*", *flags)
    else:
        logged = batch.state().where(col(st.KIND) == EVENT_ROW)
        counts = batch.counts
        logged = kb.of_keys(logged, counts.key_range, keys, events.select(*key_cols), counts.keyed)
        fields = {f.name: f.dataType for f in layout.schema().fields}
        logged_values = [st.HASH] if layout.log_hashes else layout.value_names
        logged_columns = [*keys, st.UPS, st.LIVE, *logged_values]
        compared = {c: fields[c] for c in logged_columns + ([st.SETS] if layout.logs_sets else [])}
        # The rows of one change, the logged one first: a change is new when no row comes
        # before it, and repeats an earlier one of the batch when a new one does (this
        # window replaced a grouping of the batch's changes, a shuffle and two sorts).
        same_change = Window.partitionBy(
            *[st.comparable(c, t) for c, t in compared.items()]
        ).orderBy(fresh)
        before = F.lag(fresh).over(same_change)
        per_key = Window.partitionBy(*key_cols)
        # A key whose one new change comes after all it logged continues its history
        # (see :func:`merge`); decided here, in the window the plan runs anyway (in the
        # MERGE's source, 0.5-0.8 s of a 100k-change batch into 1M rows, run twice).
        logged_last = F.max(F.when(~fresh, col(st.UPS))).over(per_key)
        # A key with several new changes, all after its log, continues it too
        # (:func:`_appended`): a hot key's history is not recomputed every batch.
        news = F.count(F.when(new_event, 1)).over(per_key)
        appends = (
            F.lit(False)
            if layout.partial
            else F.coalesce(
                F.min(F.when(new_event, col(st.UPS))).over(per_key) > logged_last, F.lit(True)
            )
            & _clear_last(layout, fresh, per_key)
        )
        rows = (
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
    if load:
        # Every change is new and its key's first: counted with the batch, and ``rows``
        # (a projection of the cached batch, read by the redo and the append) is not read
        # to count it.
        keyed, deletes = batch.counts.keyed, batch.counts.deletes
        row = {"distinct": keyed, "upserts": keyed - deletes, "deletes": deletes}
    else:
        listed = batch.counts.keyed <= kb.MAX_IN_LIST
        aggregates = [
            F.count(F.when(fresh & ~col(REPEAT), 1)).alias("distinct"),
            F.count(F.when(new_event & col(st.LIVE), 1)).alias("upserts"),
            F.count(F.when(new_event & ~col(st.LIVE), 1)).alias("deletes"),
            # The MERGE's key bound: the keys of new changes (listed if there can be few).
            *kb.aggregates(layout.keys, new_event, listed=listed),
        ]
        if reads_held:  # the rebuilt keys' logged upserts, whose values the target holds
            held = col(TOUCHED) & ~col(SIMPLE) & ~col(APPEND) & ~fresh & col(st.LIVE)
            aggregates += [
                F.count(F.when(held, 1)).alias("held"),
                *kb.aggregates(layout.keys, held, listed=listed, prefix=HELD_BOUND),
            ]
        rows, row = materialized(rows, aggregates)
    new_events = log_rows(
        rows.where(new_event).drop(FRESH, NEW, TOUCHED, SIMPLE, APPEND, REPEAT, LOGGED), layout
    )
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
        opened = _opened(layout, rows, _target_types(layout))
        return Plan(state_rows=new_events, merge=None, late=None, stats=stats, load=opened)
    run, read = merge(
        spark,
        batch.names.target,
        layout,
        batch.tracked,
        rows.where(col(TOUCHED) & (~fresh | col(NEW))).drop(NEW, TOUCHED, REPEAT),
        kb.from_row(row, layout.keys),
        sole,
        row["held"] if reads_held else 0,
        kb.from_row(row, layout.keys, prefix=HELD_BOUND),
    )
    return Plan(state_rows=new_events, merge=run, late=None, stats=stats, preview=read)
