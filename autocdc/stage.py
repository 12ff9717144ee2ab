"""Stage one micro-batch: tag each change with its sequence and operation, and split off
the rows that cannot be applied (NULL key, NULL sequence) for quarantine.

Nothing here reads state; the staged batch keeps every source column so that a row
quarantined later (late beyond the tombstone horizon) is kept whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from autocdc.errors import QUARANTINE_NULL_KEY, QUARANTINE_NULL_SEQUENCE
from autocdc.spec import FlowSpec, to_column

SEQ = "__autocdc_seq"
OP = "__autocdc_op"
REASON = "__autocdc_reason"

UPSERT, DELETE, TRUNCATE = "U", "D", "T"


def col(name: str) -> Column:
    """A column by its exact name, whatever characters it holds."""
    return F.col(f"`{name.replace('`', '``')}`")


@dataclass(frozen=True)
class StagedBatch:
    """The batch split in two; both sides are views of one cached, tagged DataFrame."""

    tagged: DataFrame  # cached: source columns + SEQ + OP + REASON
    changes: DataFrame  # source columns + SEQ + OP
    rejected: DataFrame  # source columns + SEQ + REASON
    source_columns: list[str]


def sequence_type(df: DataFrame, spec: FlowSpec):
    return df.select(spec.sequence_column().alias(SEQ)).schema[SEQ].dataType


def stage(df: DataFrame, spec: FlowSpec, keys: list[str]) -> StagedBatch:
    """Tag operations and sequence; route rows with a NULL key or sequence to ``rejected``."""
    is_truncate = (
        F.coalesce(to_column(spec.apply_as_truncates), F.lit(False))
        if spec.apply_as_truncates is not None
        else F.lit(False)
    )
    is_delete = (
        F.coalesce(to_column(spec.apply_as_deletes), F.lit(False))
        if spec.apply_as_deletes is not None
        else F.lit(False)
    )
    any_null_key = reduce(lambda a, b: a | b, [col(k).isNull() for k in keys])
    op = F.when(is_truncate, TRUNCATE).when(is_delete, DELETE).otherwise(UPSERT)
    tagged = (
        df.withColumn(SEQ, spec.sequence_column())
        .withColumn(OP, op)
        .withColumn(
            REASON,
            F.when(col(SEQ).isNull(), QUARANTINE_NULL_SEQUENCE).when(
                (col(OP) != TRUNCATE) & any_null_key, QUARANTINE_NULL_KEY
            ),
        )
        .cache()
    )
    source = list(df.columns)
    return StagedBatch(
        tagged=tagged,
        changes=tagged.where(col(REASON).isNull()).drop(REASON),
        rejected=tagged.where(col(REASON).isNotNull()).drop(OP),
        source_columns=source,
    )
