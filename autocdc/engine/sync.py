"""Bring the target up to date with the state table: one MERGE per batch.

The target is a projection of the live state rows, so syncing is idempotent: it reads
the *committed* state rows written after the last batch known to be synced and makes
each key's target row match (insert, update only if different, or delete). After a
crash between the state commit and this one, the next ``apply`` (any batch, not only a
replay) finds those rows by their batch id and syncs them again.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from autocdc.engine import state as st
from autocdc.engine import tables
from autocdc.engine.stage import col


def sync_scd1(
    spark: SparkSession, target: str, state_table: str, layout: st.Layout, after_batch: int
) -> None:
    keys, values = layout.key_names, layout.value_names
    # Rows of every batch since the last sync; after a crash, a key may have several.
    changed = st.current(st.state_rows(spark, state_table).where(col(st.BATCH) > after_batch), keys)
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
