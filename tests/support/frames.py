"""One assertion for the rows a table or a read holds, shared by the tests."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType


def assert_rows(
    spark: SparkSession, actual: DataFrame, rows: list, schema: StructType | str
) -> None:
    """``actual`` holds exactly ``rows`` (of ``schema``), in any order; nullability aside,
    since Delta and ``createDataFrame`` disagree on it."""
    expected = spark.createDataFrame(rows, schema)
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
