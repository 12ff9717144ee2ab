"""Stage one micro-batch: tag each change with its sequence and operation, and split off
the rows that cannot be applied (malformed, NULL key, NULL sequence, unreadable
BigQuery-style change columns) for quarantine.

Nothing here reads state; the staged batch keeps every source column so that a row
quarantined later (late beyond the tombstone horizon) is kept whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from autocdc.engine import change_rows
from autocdc.engine.errors import (
    QUARANTINE_MALFORMED_RECORD,
    QUARANTINE_NULL_KEY,
    QUARANTINE_NULL_SEQUENCE,
    QUARANTINE_UNKNOWN_CHANGE_TYPE,
    NondeterministicExpressionError,
)
from autocdc.engine.spec import FlowDefinition, to_column
from autocdc.engine.tables import col

SEQ = "__autocdc_seq"
OP = "__autocdc_op"
REASON = "__autocdc_reason"
SKIPPED = "skipped"  # the REASON of a row a source marked as no change

UPSERT, DELETE, TRUNCATE = "U", "D", "T"

CORRUPT_RECORD_CONF = "spark.sql.columnNameOfCorruptRecord"


def any_null(value: Column, data_type: DataType) -> Column:
    """True when the value or any field of it (for a struct sequence) is NULL."""
    if not isinstance(data_type, StructType):
        return value.isNull()
    fields = [any_null(value[f.name], f.dataType) for f in data_type.fields]
    return reduce(lambda a, b: a | b, fields, value.isNull())


def corrupt_column(df: DataFrame) -> str | None:
    """The batch's corrupt-record column, if its schema has one.

    Spark's file sources (PERMISSIVE mode, the default) put a line that does not parse,
    or a JSON/CSV field that does not fit its type, into this column as raw text and
    leave the other fields NULL or partly filled: applied as is, a wrongly typed value
    would silently become NULL in the target.
    """
    name = df.sparkSession.conf.get(CORRUPT_RECORD_CONF, "_corrupt_record")
    return name if name in df.columns else None


@dataclass(frozen=True)
class StagedBatch:
    """The batch split in two; both sides are views of one cached, tagged DataFrame."""

    tagged: DataFrame  # cached: source columns + SEQ + OP + REASON
    changes: DataFrame  # source columns + SEQ + OP
    rejected: DataFrame  # source columns + SEQ + REASON
    source_columns: list[str]


def sequence(df: DataFrame, spec: FlowDefinition) -> Column:
    """The flow's sequence over ``df``; with no ``sequence_by``, ``df`` must carry
    a string ``_CHANGE_SEQUENCE_NUMBER`` (a clear error here, not an unresolved column)."""
    if spec.is_auto:
        change_rows.require(df.schema)
    return spec.sequence_column()


def sequence_type(df: DataFrame, spec: FlowDefinition) -> DataType:
    return df.select(sequence(df, spec).alias(SEQ)).schema[SEQ].dataType


def check_deterministic(df: DataFrame, spec: FlowDefinition) -> None:
    """Refuse a sequence or operation expression that a replay could evaluate differently."""
    exprs = {"sequence_by": sequence(df, spec)}
    for field in ("apply_as_deletes", "apply_as_truncates", "apply_as_upserts"):
        if getattr(spec, field) is not None:
            exprs[field] = to_column(getattr(spec, field))
    for field, expr in exprs.items():
        jdf = getattr(df.select(expr.alias(SEQ)), "_jdf", None)
        if jdf is None:  # Spark Connect: no analyzed plan to inspect here
            continue
        projected = jdf.queryExecution().analyzed().expressions().apply(0)
        if not projected.deterministic():
            raise NondeterministicExpressionError(field=field, expression=projected.sql())


def _flag(expression: str | Column | None) -> Column:
    """A condition that is false where it is NULL (or not given)."""
    return F.lit(False) if expression is None else F.coalesce(to_column(expression), F.lit(False))


def operation(df: DataFrame, spec: FlowDefinition) -> Column:
    """Each row's operation: from ``apply_as_*``, else (no ``sequence_by``) from the feed's
    ``_CHANGE_TYPE``, else an upsert."""
    if spec.reads_change_type(df.columns):
        is_truncate, is_delete = change_rows.is_truncate(), change_rows.is_delete()
    else:
        is_truncate, is_delete = _flag(spec.apply_as_truncates), _flag(spec.apply_as_deletes)
    return F.when(is_truncate, TRUNCATE).when(is_delete, DELETE).otherwise(UPSERT)


def stage(
    df: DataFrame, spec: FlowDefinition, keys: list[str], source_columns: list[str]
) -> StagedBatch:
    """Tag operations and sequence; leave out the rows a source marked as no change
    (:data:`change_rows.NO_CHANGE`); route malformed rows (corrupt-record column set), then
    (with no ``sequence_by``) rows whose change columns cannot be read, then (with
    ``apply_as_upserts``) rows of an unknown change type, then rows with a NULL key or
    sequence (or a NULL field of a struct sequence), to ``rejected``. ``source_columns``:
    the batch's own columns, as the quarantine keeps them (the raw text of a malformed row
    included)."""
    any_null_key = reduce(lambda a, b: a | b, [col(k).isNull() for k in keys])
    sequenced = df.withColumn(SEQ, sequence(df, spec))
    null_sequence = any_null(col(SEQ), sequenced.schema[SEQ].dataType)
    # First match wins: a malformed row's NULL key or sequence is a symptom, not the cause.
    corrupt = corrupt_column(df)
    skips = change_rows.NO_CHANGE in df.columns
    checks = [(F.coalesce(col(change_rows.NO_CHANGE), F.lit(False)), SKIPPED)] if skips else []
    checks += [(col(corrupt).isNotNull(), QUARANTINE_MALFORMED_RECORD)] if corrupt else []
    if spec.is_auto:
        checks += change_rows.checks(spec.reads_change_type(df.columns), spec.stored_as_scd_type)
    if spec.apply_as_upserts is not None:  # declared: a row no condition names is unknown
        unknown = (col(OP) == UPSERT) & ~_flag(spec.apply_as_upserts)
        checks.append((unknown, QUARANTINE_UNKNOWN_CHANGE_TYPE))
    checks += [
        (null_sequence, QUARANTINE_NULL_SEQUENCE),
        ((col(OP) != TRUNCATE) & any_null_key, QUARANTINE_NULL_KEY),
    ]
    reason = reduce(lambda chain, check: chain.when(*check), checks[1:], F.when(*checks[0]))
    # Cached with every column: Spark refuses a raw JSON/CSV read that references only the
    # corrupt-record column, which a query over the uncached source could come down to.
    tagged = sequenced.withColumn(OP, operation(df, spec)).withColumn(REASON, reason).cache()
    rejected = tagged.where(col(REASON).isNotNull())
    return StagedBatch(
        tagged=tagged,
        changes=tagged.where(col(REASON).isNull()).drop(REASON, change_rows.NO_CHANGE),
        rejected=(rejected.where(col(REASON) != SKIPPED) if skips else rejected).drop(
            OP, change_rows.NO_CHANGE
        ),
        source_columns=[c for c in source_columns if c != change_rows.NO_CHANGE],
    )
