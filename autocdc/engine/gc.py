"""Compaction and tombstone collection: one rewrite of the state table.

The state table is append-only between compactions (see :mod:`autocdc.engine.state`), so it
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

from autocdc.engine import state as st
from autocdc.engine import tables
from autocdc.engine.stage import col

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
    app_id: str,
    synced_batch: int,
) -> tuple[int, int]:
    """Rewrite the state as current rows, minus dead rows untouched for
    ``retention_days`` whose delete already reached the target (batch at or below
    ``synced_batch``); one guarded commit that takes the next batch id.

    Returns (tombstones collected, the batch the target is known synced to afterwards).
    """
    # The meta row first: its batch id guards the commit (see tables.guarded_write).
    meta = st.meta_frame(spark, state_table, layout).localCheckpoint()
    before = st.read_meta(meta)
    batch = before.batch + 1
    synced = max(before.synced, synced_batch)
    synced = batch if synced >= before.batch else synced  # the rewrite adds no changes
    cutoff = datetime.now(timezone.utc) - timedelta(days=retention_days)
    victim = ~col(st.LIVE) & (col(st.UPDATED_AT) <= F.lit(cutoff)) & (col(st.BATCH) <= synced)
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
    new_meta = (
        meta.crossJoin(stats)
        .withColumn(st.FLOOR, F.greatest(st.FLOOR, MAX_DEL))
        .withColumn(st.TOMBSTONES, col(st.TOMBSTONES) - col(COLLECTED))
        .withColumn(st.BATCH, F.lit(batch).cast("long"))
        .withColumn(st.SYNCED, F.lit(synced).cast("long"))
        .withColumn(st.ROWS, col(KEPT))
        .withColumn(st.KEYS, col(KEPT))
        .withColumn(st.UPDATED_AT, F.current_timestamp())
        .localCheckpoint()
    )
    collected = new_meta.select(COLLECTED).first()[COLLECTED]
    kept = layout.select(rows.where(~col(COLLECTED)))
    rewritten = kept.unionByName(layout.select(new_meta))
    tables.guarded_write(spark, state_table, rewritten, "overwrite", app_id, batch)
    return collected, synced
