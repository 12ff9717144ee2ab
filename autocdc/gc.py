"""Tombstone collection: forget deletes older than the retention, without lying.

A collected tombstone can no longer reject an older upsert of its key, so the collection
raises the *horizon* (the largest sequence it collected) in the meta row, in the same
commit that deletes the tombstones. Later, a change at or below the horizon for a key
with no state is not applied silently (see ``late_beyond_horizon``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from autocdc import state as st
from autocdc.stage import col

COLLECTED, MAX_DEL = "__autocdc_collected", "__autocdc_max_del"


def collect(
    spark: SparkSession,
    state_table: str,
    layout: st.Layout,
    retention_days: float,
    synced_batch: int,
) -> int:
    """Delete dead state rows untouched for ``retention_days``; return how many.

    Only rows whose delete already reached the target (batch <= ``synced_batch``) go.
    """
    cutoff = datetime.now(timezone.utc) - timedelta(days=retention_days)
    victims = (
        st.state_rows(spark, state_table)
        .where(
            ~col(st.LIVE) & (col(st.UPDATED_AT) <= F.lit(cutoff)) & (col(st.BATCH) <= synced_batch)
        )
        .localCheckpoint()
    )
    stats = victims.agg(F.count(F.lit(1)).alias(COLLECTED), F.max(st.DEL).alias(MAX_DEL))
    collected = stats.first()[COLLECTED]
    if collected == 0:
        return 0
    meta = (
        st.meta_frame(spark, state_table, layout)
        .crossJoin(stats)
        .withColumn(st.FLOOR, F.greatest(st.FLOOR, MAX_DEL))
        .withColumn(st.TOMBSTONES, col(st.TOMBSTONES) - col(COLLECTED))
        .withColumn(st.SYNCED, F.greatest(st.SYNCED, F.lit(synced_batch).cast("long")))
    )
    source = layout.select(victims).unionByName(layout.select(meta))
    (
        DeltaTable.forName(spark, state_table)
        .alias("t")
        .merge(source.alias("s"), st.merge_condition(layout.key_names))
        .whenMatchedDelete(condition=f"s.{st.KIND} = '{st.STATE_ROW}' AND NOT t.{st.LIVE}")
        .whenMatchedUpdateAll(condition=f"s.{st.KIND} = '{st.META_ROW}'")
        .execute()
    )
    return collected
