"""The batch's key bound: the target MERGE skips the files that cannot hold its keys, and
the bound itself (IN-list or range) is a superset of the batch's keys."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import autocdc
from autocdc.engine import bound
from autocdc.engine.state import derived

FILES = 20
SKIPPED_METRIC = "number of target files after skipping"  # Delta's MERGE SQL metric


def files_read_by_last_merge(spark) -> int:
    """Delta's count of target files the last MERGE read after data skipping (from
    Spark's SQL status store: the table's history does not record it)."""
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    for i in reversed(range(executions.size())):
        execution = executions.apply(i)
        metrics = execution.metrics()
        for j in range(metrics.size()):
            metric = metrics.apply(j)
            if metric.name() == SKIPPED_METRIC:
                value = store.executionMetrics(execution.executionId()).get(metric.accumulatorId())
                return int(value.get().replace(",", ""))
    raise AssertionError("no MERGE ran")


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_batch_of_few_keys_reads_only_the_files_holding_them(spark, new_table, scd_type):
    target = new_table("pruned")
    flow = autocdc.AutoCdcFlow(
        target=target,
        keys=["id"],
        sequence_by="seq",
        apply_as_deletes="op = 'D'",
        except_column_list=["op", "seq"],
        stored_as_scd_type=scd_type,
    )
    ids = F.col("id") * 2  # even keys: odd ones are free for inserts
    load = spark.range(2_000).select(
        ids.alias("id"), F.lit(1).cast("long").alias("seq"), F.lit("U").alias("op"), ids.alias("v")
    )
    flow.apply(load)
    # Written in key order, as a clustered or insert-ordered table is: FILES narrow files.
    (
        spark.table(target)
        .repartitionByRange(FILES, "id")
        .sortWithinPartitions("id")
        .write.format("delta")
        .mode("overwrite")
        .option("dataChange", "false")
        .saveAsTable(target)
    )
    # Ten keys scattered over the key space: their range spans 19 of the files.
    changes = [(100 + 400 * i, 2, "U", -i) for i in range(8)] + [
        (1001, 2, "U", -100),  # an insert
        (3600, 2, "D", None),  # a delete
    ]
    flow.apply(spark.createDataFrame(changes, "id long, seq long, op string, v long"))

    # At most one file per key; without the bound all FILES, with their range 19.
    assert files_read_by_last_merge(spark) <= len(changes)
    expected = {2 * i: 2 * i for i in range(2_000)}
    expected |= {k: v for k, _, op, v in changes if op == "U"}
    del expected[3600]
    rows = {r["id"]: r["v"] for r in flow.current(spark).collect()}
    assert rows == expected


def test_the_bound_lists_few_values_ranges_many_and_leaves_unsafe_columns_out(spark):
    key, name, price = "a.b`c", "name", "price"
    keys = [
        StructField(key, LongType()),
        StructField(name, StringType()),
        StructField(price, DecimalType(10, 2)),
        StructField("at", TimestampType()),
    ]
    assert [bound.boundable(f.dataType) for f in keys] == [True, True, True, False]
    # Lowest, highest and values of the three bounded columns; nothing of the timestamp.
    assert len(bound.aggregates(keys, F.lit(True), listed=True)) == 9

    def bound_of(column: str, low, high, values=None) -> bound.KeyBound:
        fields = {derived("lo", column): low, derived("hi", column): high}
        if values is not None:
            fields[derived("in", column)] = values
        return bound.from_row(Row(**fields), keys)

    few = bound_of(key, 1, 9, [1, 5, 9])
    assert few.parts == ((key, (1, 5, 9), 1, 9),)
    many = bound_of(key, 0, 5000, list(range(bound.MAX_IN_LIST + 1)))
    assert many.parts == ((key, None, 0, 5000),)
    ranged = bound_of(key, 3, 7)
    assert ranged.parts == ((key, None, 3, 7),)
    # A string the JVM could not hand over intact (invalid UTF-8): its column unbounded.
    assert bound_of(name, "a", "z\ufffd").column() is None
    assert bound.KeyBound(()).column() is None

    schema = StructType([StructField(key, LongType()), StructField(price, DecimalType(10, 2))])
    df = spark.createDataFrame([(k, Decimal("1.50")) for k in range(12)], schema)
    assert sorted(r[0] for r in df.where(few.column()).collect()) == [1, 5, 9]
    assert sorted(r[0] for r in df.where(ranged.column()).collect()) == [3, 4, 5, 6, 7]
    assert df.where(bound_of(price, Decimal("1.50"), Decimal("1.50")).column()).count() == 12
