"""Broadcast what the engine knows to be small.

The engine runs with adaptive execution off (see defaults/spark-defaults.conf), so Spark
picks each join's strategy from its plan-time size estimates, and ours are poor: a
filtered or joined state read, or a checkpointed reconcile, is estimated at the size of
everything under it. The engine does know how many rows such a side holds (its counts and
stats aggregates ran already), so it hints the broadcast itself when that many rows fit.
The hints shorten the MERGE step of large and small batches alike; each broadcast is a
Spark job.
An unbounded hint could exhaust the driver, hence the size check: by the rows' estimated
width, and for a side whose values' lengths were summed on the way (:func:`row_bytes`,
the MERGE sources) by those bytes too, since a string is guessed at 20 bytes and a
flow's text columns may hold kilobytes.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from autocdc.engine.tables import col

# What a hinted side may take on the driver and every executor: rows times the width
# of the row's types as :func:`width` estimates it.
BROADCAST_BYTES = 64 * 1024 * 1024
_THRESHOLD = "spark.sql.autoBroadcastJoinThreshold"
# A collection's estimated number of elements: wide enough to err on the safe side.
_ELEMENTS = 16


def width(data_type: DataType) -> int:
    """Bytes a value of ``data_type`` takes, about (strings as 20, Spark's own guess)."""
    if isinstance(data_type, StructType):
        return sum(width(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _ELEMENTS * width(data_type.elementType)
    if isinstance(data_type, MapType):
        return _ELEMENTS * (width(data_type.keyType) + width(data_type.valueType))
    if isinstance(data_type, StringType):
        return 20
    if isinstance(data_type, BinaryType):
        return 100
    return 8


def row_bytes(fields: list[StructField]) -> Column:
    """About the bytes a row of ``fields`` takes in a broadcast: 8 a value, plus the length
    of each string and binary value (the part :func:`width` can only guess). Summed over a
    side's rows as it is materialized, it is what :func:`fits` checks as ``size``."""
    parts: list[Column] = [F.lit(8 * len(fields))]
    for f in fields:
        if isinstance(f.dataType, StringType | BinaryType):
            parts.append(F.coalesce(F.octet_length(col(f.name)), F.lit(0)))
        elif width(f.dataType) > 8:  # a collection or struct, by its estimate
            parts.append(F.lit(width(f.dataType)))
    return reduce(lambda a, b: a + b, parts).cast("long")


def fits(df: DataFrame, rows: int, size: int | None = None) -> bool:
    """Whether ``rows`` rows of ``df``'s columns are small enough to broadcast, by their
    estimated width and, when known, their ``size`` in bytes (see :func:`row_bytes`);
    never when the session turned broadcasting off."""
    threshold = df.sparkSession.conf.get(_THRESHOLD, "10485760") or "10485760"
    if threshold.strip().startswith("-"):
        return False
    return rows * width(df.schema) <= BROADCAST_BYTES and (size or 0) <= BROADCAST_BYTES


def small(df: DataFrame, rows: int, size: int | None = None) -> DataFrame:
    """``df``, hinted for broadcast when its ``rows`` rows (of ``size`` bytes) fit."""
    return F.broadcast(df) if fits(df, rows, size) else df
