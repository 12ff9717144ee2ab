"""The batch's key bound: a predicate on the key columns that every key a batch touches
satisfies, so that Delta's data skipping (min/max statistics per file) can leave out the
target's files that cannot hold those keys, and the state read skips the state's files
that cannot (it keeps statistics on the keys: :func:`autocdc.engine.state.statistics_columns`).

Per key column it is the column's distinct values (an IN-list) when the batch is small,
else their lowest and highest value (a range). For a composite key each column is bounded
on its own: a superset of the batch's keys, which is all a filter that only prunes needs.
Delta's data skipping reduces an IN-list to its range (``constructLiteralInListDataFilters``),
so a short list is also spelt as equalities joined by OR, which Delta tests value by
value: a few keys scattered over a key-ordered table then read only the files holding them.

The values pass through Python (an aggregate the batch runs anyway collects them), and
become literals again: only types whose values survive that trip exactly are bounded
(integers, decimals, dates and strings of the default collation); a key column of another
type is left unbounded, and a string that Spark could not hand over intact (invalid UTF-8
arrives as U+FFFD) leaves its column unbounded too. A key the bound missed would not be
matched by the MERGE, so the bound errs only on the wide side.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
)

from autocdc.engine import sizing
from autocdc.engine import state as st
from autocdc.engine.tables import col

# Up to this many keys a batch's bound lists them. A list prunes no more files than the
# range (Delta, and Parquet beyond 10 values, test only its ends); it only filters rows
# exactly before the join, and each literal costs a Py4J call (about a millisecond) when
# the bound is built.
MAX_IN_LIST = 200
# Up to this many values a column's list is also spelt as ORed equalities, each of which
# Delta tests against a file's min/max. Into a table clustered by key, a few keys'
# equalities skip most files and shorten the batch; a hundred keys' skip no more files
# than the list and cost more than it, so longer lists are not spelt out.
MAX_EQUALITIES = 32
# A batch whose source Spark estimates below this many bytes lists its keys in the stage's
# counts (Parquet of up to a few thousand rows: a set of that many keys costs nothing),
# so that its state read is filtered by them (see :func:`exact`). A larger or unsized
# source gets the range alone, as collecting a large batch's set would cost.
LISTED_BELOW_BYTES = 256 * 1024

_EXACT = (ByteType, ShortType, IntegerType, LongType, DecimalType, DateType)
_REPLACED = "\ufffd"  # what the JVM makes of bytes that are not UTF-8


def boundable(data_type: DataType) -> bool:
    """Whether a key column of this type is bounded: its values come back from Python
    as the same literals (a timestamp would pass through the driver's time zone)."""
    if isinstance(data_type, StringType):
        return data_type == StringType()  # a collation would compare otherwise
    return isinstance(data_type, _EXACT)


def _lowest(name: str, prefix: str = "") -> str:
    return st.derived(prefix + "lo", name)


def _highest(name: str, prefix: str = "") -> str:
    return st.derived(prefix + "hi", name)


def _listed(name: str, prefix: str = "") -> str:
    return st.derived(prefix + "in", name)


def aggregates(
    keys: list[StructField], where: Column, listed: bool, prefix: str = ""
) -> list[Column]:
    """Aggregates for :func:`from_row`, to run beside a batch's own: over the rows
    ``where`` holds, each boundable key column's lowest and highest value, and with
    ``listed`` (the caller knows there are at most ``MAX_IN_LIST`` rows) its values.
    ``prefix`` names them apart from another bound's in the same aggregation."""
    aggs: list[Column] = []
    for f in keys:
        if not boundable(f.dataType):
            continue
        value = F.when(where, col(f.name))
        aggs += [
            F.min(value).alias(_lowest(f.name, prefix)),
            F.max(value).alias(_highest(f.name, prefix)),
        ]
        if listed:
            aggs.append(F.collect_set(value).alias(_listed(f.name, prefix)))
    return aggs


@dataclass(frozen=True)
class KeyBound:
    """Per bounded key column: its values (an IN-list), or None and its range."""

    parts: tuple[tuple[str, tuple[object, ...] | None, object, object], ...]

    @property
    def lists(self) -> bool:
        """Whether a key column is bounded by its values (then a scan keeps only about
        the batch's keys' rows)."""
        return any(values is not None for _, values, *_ in self.parts)

    def column(self, alias: str | None = None) -> Column | None:
        """The bound over the key columns (of the DataFrame aliased ``alias``); None
        when no key column is bounded."""
        predicates = [_predicate(col(name, alias), *part) for name, *part in self.parts]
        return reduce(lambda a, b: a & b, predicates) if predicates else None


def _predicate(
    column: Column, values: tuple[object, ...] | None, low: object, high: object
) -> Column:
    if values is None:
        return column.between(F.lit(low), F.lit(high))
    listed = column.isin(list(values))
    if len(values) == 1 or len(values) > MAX_EQUALITIES:
        return listed
    # The list first (beyond 10 values Spark tests it as a hash set): a row it rejects is
    # not compared with each value, so the equalities, there for Delta's file skipping,
    # cost only the rows that hold a listed key.
    return listed & reduce(lambda a, b: a | b, [column == F.lit(v) for v in values])


def from_row(row: Row, keys: list[StructField], prefix: str = "") -> KeyBound:
    """The bound from a row of :func:`aggregates` (its values where it listed them)."""
    parts = []
    fields = row.asDict()
    for f in keys:
        low = fields.get(_lowest(f.name, prefix))
        if low is None:  # not bounded, or no row to bound
            continue
        high, values = fields[_highest(f.name, prefix)], fields.get(_listed(f.name, prefix))
        if isinstance(f.dataType, StringType) and any(
            _REPLACED in v for v in (values if values is not None else (low, high))
        ):
            continue
        listed = None if values is None or len(values) > MAX_IN_LIST else tuple(values)
        parts.append((f.name, listed, low, high))
    return KeyBound(tuple(parts))


def exact(bound: KeyBound, keys: list[str]) -> bool:
    """Whether ``bound`` holds for exactly its batch's keys: one key column, listed (a
    composite key's lists hold the product of its columns' values)."""
    return len(keys) == 1 and bound.lists  # its parts are the key columns


def restrict(df: DataFrame, bound: KeyBound) -> DataFrame:
    """``df`` where ``bound`` holds (as is when it bounds no column)."""
    predicate = bound.column()
    return df if predicate is None else df.where(predicate)


def of_keys(
    df: DataFrame, bound: KeyBound, keys: list[str], batch_keys: DataFrame, rows: int
) -> DataFrame:
    """``df``'s rows of a batch's keys: where ``bound`` holds (filtered in the scan) and,
    unless it lists them :func:`exact`-ly, in ``batch_keys`` (the batch's ``rows`` keys,
    duplicates allowed: a semi-join, broadcast when they fit)."""
    df = restrict(df, bound)
    if exact(bound, keys):
        return df
    return df.join(sizing.small(batch_keys.distinct(), rows), keys, "left_semi")


def on_keys(keys: list[str], keys_bound: KeyBound) -> Column:
    """MERGE condition: target ``t`` and source ``s`` agree on ``keys``, and the target's
    keys are within ``keys_bound`` (a predicate on ``t`` alone, which Delta prunes by)."""
    on = reduce(lambda a, b: a & b, [col(k, "t") == col(k, "s") for k in keys])
    pruned = keys_bound.column("t")
    return on if pruned is None else on & pruned
