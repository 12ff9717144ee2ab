"""SCD type 2's merge-on-read: what the MERGE (:mod:`~autocdc.engine.scd2.merge`) makes
of a read of the target, computed without writing (a read merged with staged changes)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from autocdc.engine import bound as kb
from autocdc.engine import state as st
from autocdc.engine.scd2.history import ENDS, GONE
from autocdc.engine.scd2.merge import addressed
from autocdc.engine.spec import END_AT, START_AT
from autocdc.engine.tables import col

IN_T, IN_S = "__autocdc_in_t", "__autocdc_in_s"


def preview(layout: st.Layout, target: DataFrame, source: DataFrame, sole: bool) -> DataFrame:
    """What the MERGE of ``source`` makes of ``target`` (a read of the target), nothing
    written, clause by clause: a matched version is deleted (``GONE``), ended
    (``ENDS``: only ``__END_AT``) or rewritten; an unmatched source row opens a version.
    Only the keys ``source`` touches are joined; the other rows pass as they are."""
    keys = layout.key_names
    touched = F.broadcast(source.select(*[col(k) for k in keys]).distinct())
    kept = target.join(touched, keys, "left_anti")
    held = target.join(touched, keys, "left_semi").withColumn(IN_T, F.lit(True))
    new = source.withColumn(IN_S, F.lit(True))
    on = kb.on_keys(keys, kb.KeyBound(())) & addressed(sole)
    both = held.alias("t").join(new.alias("s"), on, "full")
    in_t, in_s = col(IN_T, "t").isNotNull(), col(IN_S, "s").isNotNull()
    gone, ends = F.coalesce(col(GONE, "s"), F.lit(False)), F.coalesce(col(ENDS, "s"), F.lit(False))
    rewritten = in_t & in_s & ~ends

    def pick(c: str) -> Column:
        if c in keys or c == START_AT:
            return F.when(in_t, col(c, "t")).otherwise(col(c, "s"))
        if c == END_AT:
            return F.when(in_s, col(c, "s")).otherwise(col(c, "t"))
        return F.when(~in_t | rewritten, col(c, "s")).otherwise(col(c, "t"))

    stays = F.when(in_t, ~in_s | ~gone).otherwise(~gone & col(START_AT, "s").isNotNull())
    changed = both.where(stays).select(*[pick(c).alias(c) for c in target.columns])
    return kept.unionByName(changed)
