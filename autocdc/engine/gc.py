"""Compaction and tombstone collection: one rewrite of the (SCD type 1) state table.

The state table is append-only between compactions (see :mod:`autocdc.engine.state`), so it
keeps superseded versions of a key's row. A compaction rewrites it, in one commit, as
each key's current row plus a fresh meta row, and while at it forgets tombstones older
than the retention. A collected tombstone can no longer reject an older upsert of its
key, so the same commit raises the *horizon* (the largest sequence it collected) in the
meta row; later, a change at or below the horizon for a key with no state is not applied
silently (see ``late_beyond_horizon``).

Every state row describes a committed target (see :mod:`autocdc.engine.commit`), so any
of them may be compacted. The rewrite replaces only the rows of the batches it read
(``replaceWhere __autocdc_batch <= b``): rows another writer appends meanwhile are of
later batches and stay; a conflicting rewrite fails with a typed conflict and is retried.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from autocdc.engine import state as st
from autocdc.engine import tables
from autocdc.engine.tables import CONFLICTS, LostRace, col

COLLECTED, MAX_DEL, KEPT = "__autocdc_collected", "__autocdc_max_del", "__autocdc_kept"
# Compact once superseded rows outnumber current ones, and there are this many of them.
MIN_SUPERSEDED = 100_000


def compaction_due(meta: st.Meta) -> bool:
    superseded = meta.rows - meta.keys
    return superseded > meta.keys and superseded >= MIN_SUPERSEDED


def compact(spark: SparkSession, state_table: str, layout: st.Layout, retention_days: float) -> int:
    """Rewrite the state as current rows, minus dead rows untouched for
    ``retention_days``; returns how many tombstones were collected."""
    stored = tables.read(spark, state_table)
    meta = st.read_meta(spark, stored, layout)
    cutoff = datetime.now(timezone.utc) - timedelta(days=retention_days)
    victim = ~col(st.LIVE) & (col(st.UPDATED_AT) <= F.lit(cutoff))
    batch = meta.meta.batch
    rows = (
        st.current(st.state_rows(stored).where(col(st.BATCH) <= batch), layout.key_names)
        .withColumn(COLLECTED, victim)
        .localCheckpoint()
    )
    stats = rows.agg(
        F.count(F.when(col(COLLECTED), 1)).alias(COLLECTED),
        F.max(F.when(col(COLLECTED), col(st.DEL))).alias(MAX_DEL),
        F.count(F.when(~col(COLLECTED), 1)).alias(KEPT),
    )
    horizons = (
        meta.horizons.crossJoin(stats)
        .select(col(st.DEL), F.greatest(st.FLOOR, MAX_DEL).alias(st.FLOOR), COLLECTED, KEPT)
        .localCheckpoint()
    )
    counts = horizons.select(COLLECTED, KEPT).first()
    collected, kept = counts[COLLECTED], counts[KEPT]
    after = st.Meta(batch, meta.meta.tombstones - collected, kept, kept)
    # In key order, each file a range of keys: the key statistics then let a batch whose
    # keys lie together read only the files holding them (the rows come spread by hash).
    keys = [col(k) for k in layout.key_names]
    kept_rows = rows.where(~col(COLLECTED)).repartitionByRange(*keys).sortWithinPartitions(*keys)
    rewritten = layout.select(kept_rows).unionByName(st.meta_row(horizons, after, layout))
    rewrite(spark, state_table, rewritten, batch)
    return collected


def rewrite(spark: SparkSession, state_table: str, rows: DataFrame, batch: int) -> None:
    """Replace the rows of batches up to ``batch`` with ``rows``, in one commit."""
    try:
        rows.write.format("delta").mode("overwrite").option(
            "replaceWhere", f"{st.BATCH} <= {batch}"
        ).save(tables.default_location(spark, state_table))
    except CONFLICTS as error:
        raise LostRace(str(error)) from error
