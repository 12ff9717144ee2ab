"""SCD type 2's target MERGE: the versions :mod:`~autocdc.engine.scd2.history` computed
for the touched keys, written, ended or deleted in one MERGE."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from autocdc.engine import bound as kb
from autocdc.engine import sizing, tables
from autocdc.engine import state as st
from autocdc.engine.checkpoint import materialized
from autocdc.engine.scd2.history import ENDS, GONE, target_types
from autocdc.engine.spec import END_AT, START_AT
from autocdc.engine.tables import col


def merge(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    source: Callable[[], DataFrame],
    keys_bound: kb.KeyBound,
    sole: bool,
) -> Callable[[], DataFrame]:
    """The MERGE of ``source``'s rows (:func:`~autocdc.engine.scd2.history.changed`, built
    when the MERGE runs): a version that changed or is new is written, one that is gone
    deleted, the rest not touched. Nothing runs until called, and the target is read
    within ``keys_bound`` (the touched keys')."""
    keys, values = layout.key_names, layout.value_names
    types = target_types(layout)

    def run() -> DataFrame:
        # Materialized once: MERGE evaluates its source twice (merge.materializeSource=none).
        # Estimated at the size of all under it, it was joined with the target's rows by
        # shuffling them all, so it is counted on the way and broadcast when it fits (see
        # ``sizing``). Not under a listed bound, which leaves few target rows to shuffle:
        # there the broadcast would only be a job more.
        written = [StructField(c, t) for c, t in types.items()]
        rows, row = materialized(
            source(),
            [F.count(F.lit(1)).alias("rows"), F.sum(sizing.row_bytes(written)).alias("bytes")],
        )
        if not keys_bound.lists:
            rows = sizing.small(rows, row["rows"], row["bytes"])
        q = tables.ident
        # A source row addresses the version starting at its ``__START_AT``, or with none
        # the key's open version. Said as one null-safe equality, the join is on the keys
        # and the start: said as "equal starts, or no start and an open version", it was
        # on the keys alone, every version of a key paired with every row of it (a key
        # with many versions, many times over).
        on = kb.on_keys(keys, keys_bound) & addressed(sole)
        return (
            tables.delta_table(spark, target)
            .alias("t")
            .merge(rows.alias("s"), on)
            .whenMatchedDelete(condition=f"s.{GONE}")
            .whenMatchedUpdate(condition=f"s.{ENDS}", set={q(END_AT): f"s.{q(END_AT)}"})
            .whenMatchedUpdate(
                condition=f"NOT s.{GONE}", set={q(c): f"s.{q(c)}" for c in [*values, END_AT]}
            )
            .whenNotMatchedInsert(
                condition=f"NOT s.{GONE} AND s.{q(START_AT)} IS NOT NULL",
                values={q(c): f"s.{q(c)}" for c in types},
            )
            .execute()
        )

    return run


def addressed(sole: bool) -> Column:
    """The MERGE's condition beyond the keys: the target version ``t`` that source row
    ``s`` addresses."""
    start = col(START_AT, "s")
    if sole:  # no row addresses an open version; an adopted target's open version
        return col(START_AT, "t") == start  # is matched by its start
    open_start = F.when(col(END_AT, "t").isNotNull(), col(START_AT, "t"))
    return start.eqNullSafe(open_start)
