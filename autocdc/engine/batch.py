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

from autocdc.engine import state as st
from autocdc.engine.bound import KeyBound
from autocdc.engine.commit import Tables, holds_no_files
from autocdc.engine.spec import FlowSpec
from autocdc.engine.stage import StagedBatch, col


@dataclass(frozen=True)
class Counts:
    """The staged batch's counts (one aggregate over the cached batch), and the range of
    the keys its keyed changes touch (what the state read is bounded by)."""

    rows_in: int  # rows that carry a change: all but the skipped
    rejected: int
    skipped: int  # rows a source marked as no change (change_rows.NO_CHANGE)
    truncates: int
    keyed: int
    key_range: KeyBound


@dataclass(frozen=True)
class Batch:
    spark: SparkSession
    spec: FlowSpec
    names: Tables
    layout: st.Layout
    tracked: list[str]  # SCD type 2: value columns whose change opens a version
    staged: StagedBatch
    counts: Counts
    meta: st.MetaFrame
    batch_id: int


def sole_changes(batch: Batch) -> bool:
    """Whether nothing is stored yet (no state row, no horizon, no truncate now) and no
    two of the batch's changes share a key: then each change is its key's whole history
    and a strategy folds it row by row, with no shuffle of the batch (an initial load:
    the fold's shuffle and sort were most of a 2M-row first batch). One job over the
    keys alone, run for such a first batch only."""
    meta = batch.meta
    if meta.meta.rows or not meta.empty or batch.counts.truncates:
        return False
    keys = [col(k) for k in batch.layout.key_names]
    return batch.staged.changes.select(*keys).distinct().count() == batch.counts.keyed


def into_empty_target(batch: Batch) -> bool:
    """Whether the target holds no file: then an initial load (:func:`sole_changes`) only
    inserts, and its rows are appended rather than MERGEd (a MERGE of 2M rows into an empty
    table took 2.7-3.0 s, their append 1.6 s). One small job, for such a first batch only."""
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
        )
