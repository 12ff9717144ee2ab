"""SCD type 1's merge-on-read: what the MERGE (:mod:`~autocdc.engine.scd1.merge`) makes
of a read of the target, computed without writing (a read merged with staged changes)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from autocdc.engine import state as st
from autocdc.engine.scd1.merge import settle_ties
from autocdc.engine.scd1.reconcile import ACT_UPSERT, ACTION, TIE
from autocdc.engine.tables import col


def preview(layout: st.Layout, changes: DataFrame, ties: int) -> Callable[[DataFrame], DataFrame]:
    """What the MERGE makes of ``target`` (a read of the target), nothing written: every
    key with an action loses its row, and its upsert, unless it ties the held row and
    loses to it (the same :func:`~autocdc.engine.scd1.merge.settle_ties`), brings the
    new one. Not for a partial target (its MERGE sets columns one by one)."""
    keys, values = layout.key_names, layout.value_names
    source = changes.where(col(ACTION).isNotNull()).select(
        *[col(c) for c in [*keys, *values, ACTION, TIE]]
    )

    def read(target: DataFrame) -> DataFrame:
        settled = settle_ties(target, layout, source, ties) if ties else source
        kept = target.join(F.broadcast(settled.select(*[col(k) for k in keys])), keys, "left_anti")
        upserts = settled.where(col(ACTION) == ACT_UPSERT)
        return kept.unionByName(upserts.select(*[col(c) for c in target.columns]))

    return read
