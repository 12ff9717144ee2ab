"""Bring the target up to date with the state table: one MERGE per batch.

The target is a projection of the live state rows, so syncing is idempotent: it makes
each changed key's target row match its state row (insert, update only if different,
or delete). Normally the changed rows are the batch's own new state rows, still in
memory; after a crash between the state commit and this one, the next ``apply`` (any
batch, not only a replay) reads the *committed* state rows written after the last batch
known to be synced, by their batch id, and syncs them too.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from autocdc.engine import state as st
from autocdc.engine import tables
from autocdc.engine.stage import col


def pending(
    spark: SparkSession, state_table: str, layout: st.Layout, after_batch: int
) -> DataFrame:
    """Each key's newest state row committed after batch ``after_batch``."""
    rows = st.state_rows(spark, state_table).where(col(st.BATCH) > after_batch)
    return st.current(rows, layout.key_names)


def sync_scd1(spark: SparkSession, target: str, layout: st.Layout, changed: DataFrame) -> None:
    """MERGE ``changed`` (state rows, at most one per key) into the target."""
    keys, values = layout.key_names, layout.value_names
    source = changed.select(*[col(c) for c in [*keys, *values, st.LIVE]])
    q = tables.ident
    on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
    same = " AND ".join(st.same_sql(f.name, f.dataType) for f in layout.values) or "TRUE"
    live = f"s.{st.LIVE}"
    (
        tables.delta_table(spark, target)
        .alias("t")
        .merge(source.alias("s"), on)
        .whenMatchedDelete(condition=f"NOT {live}")
        .whenMatchedUpdate(
            condition=f"{live} AND NOT ({same})", set={q(v): f"s.{q(v)}" for v in values}
        )
        .whenNotMatchedInsert(condition=live, values={q(c): f"s.{q(c)}" for c in keys + values})
        .execute()
    )
