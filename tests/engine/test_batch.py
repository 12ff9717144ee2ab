"""How a first batch is judged sole (no key twice): the exact count of distinct integer
keys by bitmaps, and when a key's range is dense enough to count it that way."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StringType, StructField

from autocdc.engine.batch import bitmap_range, dense_integer_key, distinct_integers
from autocdc.engine.bound import KeyBound

ID = StructField("id", LongType())


def test_bitmaps_count_distinct_integers_exactly_across_ranges_and_signs(spark):
    values = [0, 1, -1, 32_767, 32_768, 32_769, -32_768, -32_769, 2**62, -(2**62), 1, -1, None]
    df = spark.createDataFrame([(v,) for v in values], "id long")
    assert distinct_integers(df, "id") == 10
    assert distinct_integers(df.limit(0), "id") == 0


@pytest.mark.parametrize(
    ("keys", "low", "high", "rows", "expected"),
    [
        ([ID], 0, 9_999_999, 10_000_000, "id"),  # 306 ranges of 4 KiB for 10M rows
        ([ID], 1, 32_768, 4_096, "id"),  # one range: a byte a row
        ([ID], 1, 32_768, 4_095, None),  # fewer rows than the range's bytes
        ([ID], -5, 5, 8_192, "id"),  # two ranges: 0 holds -32767..0, 1 holds 1..32768
        ([ID], -32_768, 32_769, 8_192, None),  # four ranges
        ([ID], 0, 2**40, 10_000_000, None),  # sparse: 33M ranges
        ([StructField("id", StringType())], "a", "b", 10_000, None),
        ([ID, StructField("n", LongType())], 0, 9, 10_000, None),  # a composite key
    ],
)
def test_only_one_integer_key_in_a_dense_range_is_counted_by_bitmaps(
    keys, low, high, rows, expected
):
    bound = KeyBound(((keys[0].name, None, low, high),))
    assert dense_integer_key(keys, bound, rows) == expected


def test_an_unbounded_key_is_not_counted_by_bitmaps():
    assert dense_integer_key([ID], KeyBound(()), 10_000) is None


def test_ranges_are_numbered_as_sparks_bitmaps_number_them(spark):
    values = [-65_537, -32_768, -32_767, 0, 1, 32_768, 32_769]
    row = spark.sql("SELECT " + ", ".join(f"bitmap_bucket_number({v}L)" for v in values)).first()
    assert [bitmap_range(v) for v in values] == list(row)
