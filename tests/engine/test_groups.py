"""Sequence groups (docs/semantics.md, sequence groups): two producers on independent
clocks of different types feed one SCD type 1 row, each ordering its own columns.

The shop sends `status`, `amount` ordered by a timestamp, `order_ts`; the warehouse
sends `shipped_at`, `carrier` ordered by a bigint scan counter, `ship_seq`. Nothing
orders one clock against the other: a delete from one producer wipes its own columns set
at or below it, never the other's; the row shows while either producer's latest upsert
is above its latest delete.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

import autocdc
from autocdc.engine.errors import DefinitionChangedError, SequenceGroupsError

GROUPS = {"shop": ["status", "amount"], "warehouse": ["shipped_at", "carrier"]}
SHOP = StructType(
    [
        StructField("order_id", LongType()),
        StructField("status", StringType()),
        StructField("amount", LongType()),
        StructField("op", StringType()),
        StructField("order_ts", TimestampType()),
    ]
)
WAREHOUSE = StructType(
    [
        StructField("order_id", LongType()),
        StructField("shipped_at", StringType()),
        StructField("carrier", StringType()),
        StructField("kind", StringType()),
        StructField("ship_seq", LongType()),
    ]
)


def shop_flow(target: str, **extra) -> autocdc.AutoCdcFlow:
    declared = {
        "name": f"{target}_shop",
        "keys": ["order_id"],
        "sequence_by": "order_ts",
        "apply_as_deletes": "op = 'D'",
        "except_column_list": ["op", "order_ts"],
        "sequence_groups": GROUPS,
        "sequence_group": "shop",
    }
    return autocdc.AutoCdcFlow(target=target, **{**declared, **extra})


def warehouse_flow(target: str, **extra) -> autocdc.AutoCdcFlow:
    return autocdc.AutoCdcFlow(
        target=target,
        name=f"{target}_warehouse",
        keys=["order_id"],
        sequence_by="ship_seq",
        apply_as_deletes="kind = 'D'",
        except_column_list=["kind", "ship_seq"],
        ignore_null_updates=True,  # a carrier scan leaves shipped_at as it is
        sequence_groups=GROUPS,
        sequence_group="warehouse",
        **extra,
    )


def t(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 1, hour, minute)


def rows(spark, target: str) -> dict:
    cols = ["status", "amount", "shipped_at", "carrier"]
    return {r["order_id"]: tuple(r[c] for c in cols) for r in spark.table(target).collect()}


def test_delete_from_one_producer_keeps_the_columns_of_the_other(spark, new_table):
    """The shop deletes order 1 at 11:00 on its clock; the warehouse scanned it at scan
    5 and 7 (its own clock, which no one can place before or after 11:00). The delete
    wipes the shop's columns only: the row stays, of shipping columns; the shop's upsert
    at 10:00, older than its delete, arriving late, stays out; the shop's reinsert at
    12:00 brings its columns back beside the warehouse's. Order 2: the warehouse's delete
    (scan 6) wipes its own columns set at or below it (scan 4), and the shop's row stays;
    order 3: both producers delete, the row is gone; a warehouse scan below its delete
    arriving later stays out. The same in any arrival order."""
    target = new_table("groups_delete")
    shop = [
        (1, "paid", 30, "U", t(10)),
        (1, None, None, "D", t(11)),
        (2, "paid", 8, "U", t(9)),
        (3, "placed", 5, "U", t(9)),
        (3, None, None, "D", t(9, 30)),
    ]
    warehouse = [
        (1, "12:00", "DHL", "U", 5),
        (1, None, "UPS", "U", 7),
        (2, "10:45", "DHL", "U", 4),
        (2, None, None, "D", 6),
        (3, "09:10", "DHL", "U", 2),
        (3, None, None, "D", 3),
    ]
    late_shop = [(1, "placed", 30, "U", t(9, 59))]
    late_warehouse = [(3, "08:00", "FedEx", "U", 1)]
    reinsert = [(1, "refunded", 0, "U", t(12))]
    shop_f, warehouse_f = shop_flow(target), warehouse_flow(target)
    warehouse_f.apply(spark.createDataFrame(warehouse, WAREHOUSE))
    shop_f.apply(spark.createDataFrame(shop + late_shop, SHOP))
    shop_f.apply(spark.createDataFrame(shop, SHOP))  # a replay changes nothing
    warehouse_f.apply(spark.createDataFrame(late_warehouse, WAREHOUSE))
    assert rows(spark, target) == {
        1: (None, None, "12:00", "UPS"),
        2: ("paid", 8, None, None),
    }
    shop_f.apply(spark.createDataFrame(reinsert, SHOP))
    assert rows(spark, target) == {
        1: ("refunded", 0, "12:00", "UPS"),
        2: ("paid", 8, None, None),
    }

    # Another arrival order and batching gives the same target.
    other = new_table("groups_delete")
    shop_g, warehouse_g = shop_flow(other), warehouse_flow(other)
    shop_g.apply(spark.createDataFrame(reinsert + shop[::-1], SHOP))
    warehouse_g.apply(spark.createDataFrame(late_warehouse + warehouse[3:], WAREHOUSE))
    shop_g.apply(spark.createDataFrame(late_shop, SHOP))
    warehouse_g.apply(spark.createDataFrame(warehouse[:3], WAREHOUSE))
    assert rows(spark, other) == rows(spark, target)


def test_bad_group_declarations_are_refused(spark, new_table):
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", sequence_group="nowhere")
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", stored_as_scd_type=2)
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", apply_as_truncates="op = 'T'")
    with pytest.raises(SequenceGroupsError):
        autocdc.AutoCdcFlow(target="x", keys=["order_id"], sequence_by="s", sequence_group="a")
    with pytest.raises(SequenceGroupsError):
        autocdc.AutoCdcFlow(
            target="x",
            keys=["order_id"],
            sequence_by="s",
            sequence_groups={"a": ["v", "w"], "b": ["w"]},
            sequence_group="a",
        )
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", columns_to_update=["status", "carrier"])  # carrier: the warehouse's
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", sequence_groups={"shop": ["order_id", "status"], "w": ["carrier"]})
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", sequence_by=None)
    with pytest.raises(SequenceGroupsError):
        shop_flow("x", sequence_groups={"shop": [], "warehouse": ["carrier"]})
    assert shop_flow("x").partial and shop_flow("x", columns_to_update=["status"]).partial
    target = new_table("groups_refused")
    shop_flow(target).apply(spark.createDataFrame([(1, "paid", 3, "U", t(9))], SHOP))
    # A flow into the target that declares other groups, or none.
    other = {"shop": ["status"], "warehouse": ["amount", "shipped_at", "carrier"]}
    batch = spark.createDataFrame([(1, "12:00", "DHL", "U", 5)], WAREHOUSE)
    with pytest.raises(SequenceGroupsError):
        autocdc.AutoCdcFlow(
            target=target,
            keys=["order_id"],
            sequence_by="ship_seq",
            except_column_list=["kind", "ship_seq"],
            sequence_groups=other,
            sequence_group="warehouse",
        ).apply(batch)
    with pytest.raises(SequenceGroupsError):
        autocdc.AutoCdcFlow(
            target=target,
            keys=["order_id"],
            sequence_by="ship_seq",
            except_column_list=["kind", "ship_seq"],
            partial_target=True,
        ).apply(batch)
    # The shop's clock is a timestamp: a bigint one is another definition.
    with pytest.raises(DefinitionChangedError):
        shop_flow(target, name="shop_by_number", sequence_by="amount").apply(
            spark.createDataFrame([(1, "paid", 3, "U", t(9))], SHOP)
        )
