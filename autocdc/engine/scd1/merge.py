"""SCD type 1's target MERGE: the actions of the reconcile
(:mod:`~autocdc.engine.scd1.reconcile`) written to the target, the ties settled first
against the rows it holds."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from autocdc.engine import bound as kb
from autocdc.engine import sizing, tables
from autocdc.engine import state as st
from autocdc.engine.scd1.reconcile import ACT_DELETE, ACT_UPSERT, ACTION, TIE, take, tie, wipe
from autocdc.engine.tables import col

NEW_TIE, HELD_TIE = "__autocdc_new_tie", "__autocdc_held_tie"  # settling ties


def merge(
    spark: SparkSession,
    target: str,
    layout: st.Layout,
    changes: DataFrame,
    keys_bound: kb.KeyBound,
    actions: int,
    ties: int,
    size: int | None,
) -> Callable[[], DataFrame]:
    """The target MERGE of the ``actions`` keys whose ACTION is set (not run until
    called), broadcast when they fit (``size``: their keys' and values' bytes, see
    ``sizing.row_bytes``); the condition also bounds the target's keys by
    ``keys_bound`` (theirs), so that Delta skips the files that cannot hold them.

    Unless the target is partial, no clause reads the target's values: a clause that
    does makes Delta read every column of every file the MERGE touches, which makes a
    small batch into a large table markedly slower. The ``ties`` upserts that tie the stored
    winner's sequence are settled before it (:func:`settle_ties`), and an upsert whose
    values equal the row's is written anyway, the same row again."""
    keys, values = layout.key_names, layout.value_names
    q = tables.ident
    flags = (
        [c for v in values for c in (take(v), tie(v), wipe(v))]
        if layout.per_column_sequences
        else [TIE]
    )
    source = changes.where(col(ACTION).isNotNull()).select(
        *[col(c) for c in [*keys, *values, ACTION, *flags]]
    )
    source = sizing.small(source, actions, size)
    on = kb.on_keys(keys, keys_bound)
    is_upsert = f"s.{ACTION} = '{ACT_UPSERT}'"
    if layout.per_column_sequences:
        update_set = {}
        for f in layout.values:
            v = q(f.name)
            new, held = (st.comparable_sql(f.name, f.dataType, a) for a in ("s", "t"))
            # NULL lowest: an upsert may set a column to NULL, and a tie with it loses.
            greater = f"({new} IS NOT NULL AND ({held} IS NULL OR {new} > {held}))"
            update_set[v] = (
                f"CASE WHEN s.{q(take(f.name))} THEN s.{v} "
                f"WHEN s.{q(tie(f.name))} AND {greater} THEN s.{v} "
                f"WHEN s.{q(wipe(f.name))} THEN NULL ELSE t.{v} END"
            )
        update_condition = is_upsert
    else:
        update_set = {q(v): f"s.{q(v)}" for v in values}
        update_condition = is_upsert

    def run() -> DataFrame:
        settled = settle_ties(tables.read(spark, target), layout, source, ties) if ties else source
        return (
            tables.delta_table(spark, target)
            .alias("t")
            .merge(settled.alias("s"), on)
            .whenMatchedDelete(condition=f"s.{ACTION} = '{ACT_DELETE}'")
            .whenMatchedUpdate(condition=update_condition, set=update_set)
            .whenNotMatchedInsert(
                condition=is_upsert, values={q(c): f"s.{q(c)}" for c in keys + values}
            )
            .execute()
        )

    return run


def settle_ties(held: DataFrame, layout: st.Layout, source: DataFrame, ties: int) -> DataFrame:
    """``source`` without the ``ties`` tied upserts that lose to the row the target holds
    (``held``, a read of it; the greater row wins, compared in the declared tie order).
    Ties are rare: their keys' rows are read on their own, and the MERGE reads no value
    of the target."""
    keys = [col(k) for k in layout.key_names]
    tied = source.where(col(TIE) & (col(ACTION) == ACT_UPSERT)).select(
        *keys, layout.tie().alias(NEW_TIE)
    )
    held = held.select(*keys, layout.tie().alias(HELD_TIE))
    wins = F.coalesce(col(NEW_TIE) > col(HELD_TIE), F.lit(False))
    losers = (
        held.join(sizing.small(tied, ties), layout.key_names)
        .where(~wins)
        .select(*keys)
        .localCheckpoint()
    )
    return source.join(sizing.small(losers, ties), layout.key_names, "left_anti")
