"""The batch's key bound: the target MERGE skips the files that cannot hold its keys, and
the bound itself (IN-list or range) is a superset of the batch's keys."""

from __future__ import annotations

import json
from decimal import Decimal
from itertools import pairwise

import pytest
from changes import feed_flow
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
from autocdc.engine.tuning import session_conf

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
    flow = feed_flow(target, scd_type)
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
    assert few.lists and not many.lists and not ranged.lists
    # Only a list of a sole key column is the batch's keys exactly.
    assert bound.exact(few, [key])
    assert not bound.exact(few, [key, name])
    assert not bound.exact(ranged, [key]) and not bound.exact(many, [key])
    # A string the JVM could not hand over intact (invalid UTF-8): its column unbounded.
    assert bound_of(name, "a", "z\ufffd").column() is None
    assert bound.KeyBound(()).column() is None

    schema = StructType([StructField(key, LongType()), StructField(price, DecimalType(10, 2))])
    df = spark.createDataFrame([(k, Decimal("1.50")) for k in range(12)], schema)
    assert sorted(r[0] for r in df.where(few.column()).collect()) == [1, 5, 9]
    assert sorted(r[0] for r in df.where(ranged.column()).collect()) == [3, 4, 5, 6, 7]
    assert df.where(bound_of(price, Decimal("1.50"), Decimal("1.50")).column()).count() == 12


def test_a_small_batch_from_files_reads_the_state_of_its_listed_keys(
    spark, new_table, tmp_path, monkeypatch
):
    """A source Spark sizes (files) below ``LISTED_BELOW_BYTES`` lists its keys in the
    counts, and the state read keeps those keys by the list alone (no semi-join with the
    batch); a source without a size (rows from Python) keeps the range and the join."""
    exact, seen = bound.exact, []
    monkeypatch.setattr(bound, "exact", lambda b, keys: seen.append(exact(b, keys)) or seen[-1])
    flow = feed_flow(new_table("listed"))
    schema = "id long, seq long, op string, v long"
    flow.apply(spark.createDataFrame([(k, 1, "U", k) for k in range(6)], schema))
    flow.apply(spark.createDataFrame([(1, 2, "U", 10), (2, 2, "D", None)], schema))
    spark.createDataFrame(
        [(3, 3, "U", 30), (4, 3, "D", None), (2, 1, "U", 0)], schema
    ).write.parquet(str(tmp_path / "batch"))
    flow.apply(spark.read.parquet(str(tmp_path / "batch")))
    assert seen == [False, True]  # the first batch read no state
    rows = {r["id"]: r["v"] for r in flow.current(spark).collect()}
    assert rows == {0: 0, 1: 10, 3: 30, 5: 5}  # the late upsert of 2 stays deleted


def test_the_state_keeps_key_statistics_and_compacts_into_key_ranges(spark, new_table):
    """Issue 32, item 1: the state table keeps min/max statistics on the keys, and a
    compaction writes each key's current row in key order, a range of keys per file, so
    that a batch whose keys lie together reads only the state files holding them."""
    target = new_table("ranged")
    flow = autocdc.AutoCdcFlow(
        target=target, keys=["id"], sequence_by="seq", except_column_list=["seq"]
    )
    for seq in (1, 2):  # every key twice: half the state rows superseded
        flow.apply(spark.range(400).select("id", F.lit(seq).cast("long").alias("seq")))
    with session_conf(spark, {"spark.sql.shuffle.partitions": "4"}):  # the tests' is 1
        flow.collect_tombstones(spark)

    location = spark.sql(f"DESCRIBE DETAIL {flow.state_table}").first()["location"]
    files = spark.read.format("delta").load(location).select(F.input_file_name().alias("f"), "id")
    ranges = files.where("id IS NOT NULL").groupBy("f").agg(F.min("id"), F.max("id")).collect()
    ranges = sorted((r[1], r[2]) for r in ranges)
    assert len(ranges) > 1
    assert all(high < low for (_, high), (low, _) in pairwise(ranges))  # disjoint
    assert ranges[0][0] == 0 and ranges[-1][1] == 399
    assert files.where("id IS NOT NULL").count() == 400  # one current row per key

    log = spark.read.json(f"{location}/_delta_log/*.json").where("add IS NOT NULL")
    stats = [json.loads(r[0]) for r in log.select("add.stats").collect() if r[0]]
    data = [s for s in stats if s["maxValues"]["__autocdc_kind"] != "M"]  # not meta rows alone
    assert data and all("id" in s["minValues"] for s in data)
