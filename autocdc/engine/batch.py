"""One micro-batch on its way through the chain, and what a strategy plans for it.

``AutoCdcFlow.apply`` builds a :class:`Batch` (the staged changes, fitted to the stored
tables, with the state's meta), hands it to the SCD strategy (:func:`autocdc.engine.scd1.plan`
or :func:`autocdc.engine.scd2.plan`), and commits the :class:`Plan` it gets back with the
protocol of :mod:`autocdc.engine.commit`. A strategy writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, StructField

from autocdc.engine import bound, tuning
from autocdc.engine import state as st
from autocdc.engine.bound import KeyBound
from autocdc.engine.commit import Stored, Tables, holds_no_files
from autocdc.engine.spec import FlowDefinition
from autocdc.engine.stage import DELETE, OP, REASON, SKIPPED, TRUNCATE, StagedBatch
from autocdc.engine.tables import col

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_BITMAP_VALUES = 32768  # the values one of Spark's bitmaps covers (bitmap_bucket_number)
_BITMAP_BYTES = _BITMAP_VALUES // 8


@dataclass(frozen=True)
class Counts:
    """The staged batch's counts (one aggregate over the cached batch), and the range of
    the keys its keyed changes touch (what the state read is bounded by)."""

    rows_in: int  # rows that carry a change: all but the skipped
    rejected: int
    skipped: int  # rows a source marked as no change (change_rows.NO_CHANGE)
    truncates: int
    keyed: int
    deletes: int  # keyed changes that delete
    key_range: KeyBound


def count(staged: StagedBatch, keys: list[StructField], listed: bool = False) -> Counts:
    """One aggregate over the cached batch (which it materializes); the key range (with
    ``listed``, the keys themselves when there are few) rides on it rather than costing a
    job of its own."""
    ok = col(REASON).isNull()
    keyed = ok & (col(OP) != TRUNCATE)
    skipped = col(REASON) == SKIPPED
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


def count_sized(
    source: DataFrame, staged: StagedBatch, keys: list[StructField], stored_rows: int
) -> Counts:
    """:func:`count` with the settings that suit the source's estimated size, the keys
    listed when the source is small enough that they are few."""
    source_bytes = tuning.estimated_bytes(source)
    listed = source_bytes is not None and source_bytes < bound.LISTED_BELOW_BYTES
    with tuning.staging(source.sparkSession, stored_rows, source_bytes):
        return count(staged, keys, listed)


NOTHING = Counts(0, 0, 0, 0, 0, 0, KeyBound(()))  # a replayed stage's: it reads nothing


@dataclass(frozen=True)
class Batch:
    spark: SparkSession
    spec: FlowDefinition
    names: Tables
    layout: st.Layout
    tracked: list[str]  # SCD type 2: value columns whose change opens a version
    staged: StagedBatch
    counts: Counts
    meta: st.MetaFrame
    stored: Stored
    batch_id: int

    def state(self) -> DataFrame:
        """Every state row of the committed batches (the table's and the pending ones)."""
        return self.stored.read(self.spark, self.layout.schema())


def sole_changes(batch: Batch) -> bool:
    """Whether nothing is stored yet (no state row, no horizon, no truncate now) and no
    two of the batch's changes share a key: then each change is its key's whole history
    and a strategy folds it row by row, with no shuffle of the batch (an initial load:
    the fold's shuffle and sort were most of a 2M-row first batch). One job over the
    keys alone, run for such a first batch only."""
    meta = batch.meta
    if meta.meta.rows or not meta.empty or batch.counts.truncates:
        return False
    changes, counts = batch.staged.changes, batch.counts
    dense = dense_integer_key(batch.layout.keys, counts.key_range, counts.keyed)
    if dense is not None:
        return distinct_integers(changes, dense) == counts.keyed
    keys = [col(k) for k in batch.layout.key_names]
    return changes.select(*keys).distinct().count() == counts.keyed


def dense_integer_key(keys: list[StructField], key_range: KeyBound, rows: int) -> str | None:
    """The key column, when the key is one integer column whose range is dense enough
    for :func:`distinct_integers`: its bitmaps (4 KiB a range of 32,768 values) take no
    more than a byte per row, however the values spread within the range."""
    if len(keys) != 1 or not isinstance(keys[0].dataType, _INTEGERS):
        return None
    bounds = {name: (low, high) for name, _, low, high in key_range.parts}
    if keys[0].name not in bounds:
        return None
    low, high = bounds[keys[0].name]
    ranges = bitmap_range(high) - bitmap_range(low) + 1
    return keys[0].name if ranges * _BITMAP_BYTES <= rows else None


def bitmap_range(value: int) -> int:
    """Spark's ``bitmap_bucket_number``: 1..32768 is range 1, -32767..0 range 0."""
    if value > 0:
        return 1 + (value - 1) // _BITMAP_VALUES
    return -(-value // _BITMAP_VALUES)


def distinct_integers(df: DataFrame, name: str) -> int:
    """How many distinct non-NULL values integer column ``name`` holds, counted exactly
    with Spark's bitmaps: one row per range of 32,768 values crosses the shuffle, not
    one per value (about a third of ``distinct``'s time over millions of keys)."""
    value = col(name)
    per_range = df.groupBy(F.bitmap_bucket_number(value).alias("range")).agg(
        F.bitmap_construct_agg(F.bitmap_bit_position(value)).alias("bits")
    )
    return per_range.agg(F.sum(F.bitmap_count("bits"))).first()[0] or 0


def into_empty_target(batch: Batch) -> bool:
    """Whether the target holds no file: then an initial load (:func:`sole_changes`) only
    inserts, and its rows are appended rather than MERGEd (an append takes about half the
    time of a MERGE into an empty table). One small job, for such a first batch only."""
    return holds_no_files(batch.spark, batch.names.target)


@dataclass(frozen=True)
class Plan:
    """What the batch changes; nothing of it has run yet (DataFrames are materialized
    where they are read twice)."""

    state_rows: DataFrame  # new state (or log) rows, in the state table's layout
    merge: Callable[[], DataFrame] | None  # the target MERGE, None if the target is as is
    late: DataFrame | None  # changes the reconcile quarantines: source columns, SEQ, REASON
    stats: dict[str, int] = field(default_factory=dict)
    horizons: DataFrame | None = None  # SCD type 1: new horizons (a truncate moved them)
    # An initial load into an empty target: its rows, appended instead of ``merge``.
    load: DataFrame | None = None
    # What ``merge`` makes of a read of the target, computed without writing (a read
    # merged with staged changes: see :func:`merged`).
    preview: Callable[[DataFrame], DataFrame] | None = None

    @property
    def changes_state(self) -> bool:
        return self.stats.get("changed", 0) > 0

    @property
    def changes_anything(self) -> bool:
        return (
            self.changes_state
            or self.merge is not None
            or self.load is not None
            or self.late is not None
            or self.horizons is not None
        )


def merged(target: DataFrame, plan: Plan) -> DataFrame:
    """``target`` (a read of the target) as the plan's commit would leave it, nothing
    written: the rows of the plan's MERGE (or initial load) merged in at read time."""
    if plan.load is not None:
        return target.unionByName(plan.load.select(*[col(c) for c in target.columns]))
    if plan.merge is None:
        return target
    if plan.preview is None:  # a mode with no merge-on-read: the spec refuses it first
        raise NotImplementedError("this plan's MERGE has no merge-on-read")
    return plan.preview(target)
