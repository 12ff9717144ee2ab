"""Compaction and tombstone collection: one rewrite of the state table.

The state table is append-only between compactions (see :mod:`autocdc.state`), so it
keeps superseded versions of a key's row. A compaction rewrites it, in one commit, as
each key's current row plus a fresh meta row, and while at it forgets tombstones older
than the retention. A collected tombstone can no longer reject an older upsert of its
key, so the same commit raises the *horizon* (the largest sequence it collected) in the
meta row; later, a change at or below the horizon for a key with no state is not applied
silently (see ``late_beyond_horizon``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from autocdc import state as st
from autocdc.stage import col

COLLECTED, MAX_DEL, KEPT = "__autocdc_collected", "__autocdc_max_del", "__autocdc_kept"
# Compact once superseded rows outnumber current ones, and there are this many of them.
MIN_SUPERSEDED = 100_000


def compaction_due(meta: st.Meta) -> bool:
    superseded = meta.rows - meta.keys
    return superseded > meta.keys and superseded >= MIN_SUPERSEDED


def compact(
    spark: SparkSession,
    state_table: str,
    layout: st.Layout,
    retention_days: float,
    synced_batch: int,
) -> int:
    """Rewrite the state as current rows, minus dead rows untouched for
    ``retention_days`` whose delete already reached the target; return how many died."""
    cutoff = datetime.now(timezone.utc) - timedelta(days=retention_days)
    victim = ~col(st.LIVE) & (col(st.UPDATED_AT) <= F.lit(cutoff)) & (col(st.BATCH) <= synced_batch)
    rows = (
        st.current(st.state_rows(spark, state_table), layout.key_names)
        .withColumn(COLLECTED, victim)
        .localCheckpoint()
    )
    stats = rows.agg(
        F.count(F.when(col(COLLECTED), 1)).alias(COLLECTED),
        F.max(F.when(col(COLLECTED), col(st.DEL))).alias(MAX_DEL),
        F.count(F.when(~col(COLLECTED), 1)).alias(KEPT),
    )
    meta = (
        st.meta_frame(spark, state_table, layout)
        .crossJoin(stats)
        .withColumn(st.FLOOR, F.greatest(st.FLOOR, MAX_DEL))
        .withColumn(st.TOMBSTONES, col(st.TOMBSTONES) - col(COLLECTED))
        .withColumn(st.SYNCED, F.greatest(st.SYNCED, F.lit(synced_batch).cast("long")))
        .withColumn(st.ROWS, col(KEPT))
        .withColumn(st.KEYS, col(KEPT))
        .localCheckpoint()
    )
    collected = meta.first()[COLLECTED]
    kept = layout.select(rows.where(~col(COLLECTED)))
    kept.unionByName(layout.select(meta)).writeTo(state_table).overwrite(F.lit(True))
    return collected
