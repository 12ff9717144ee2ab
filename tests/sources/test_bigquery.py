"""BigQuery-style change rows: a flow with no ``sequence_by`` reads ``_CHANGE_TYPE`` and
``_CHANGE_SEQUENCE_NUMBER``, quarantines what they cannot place, and stores neither."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from frames import assert_rows
from processes import ROOT
from projects import copy_example, run
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

import autocdc
from autocdc.engine.errors import (
    QUARANTINE_MALFORMED_SEQUENCE,
    QUARANTINE_NULL_KEY,
    QUARANTINE_NULL_SEQUENCE,
    QUARANTINE_TRUNCATE_IN_SCD2,
    QUARANTINE_UNKNOWN_CHANGE_TYPE,
)

EXAMPLE = ROOT / "pipelines" / "bigquery"
SCHEMA = "id int, name string, _CHANGE_TYPE string, _CHANGE_SEQUENCE_NUMBER string"
TARGET = "id int, name string"
# Each key's winner differs from the one a string comparison of the sequence would pick.
CHANGES = [
    (1, "a-late", "UPSERT", "16/B374D848"),
    (1, "a-early", "UPSERT", "9/FFFFFFFF"),
    (2, "b-short", "UPSERT", "A"),
    (2, "b-long", "UPSERT", "A/0"),  # one more section: later than "A"
    (3, "c", "UPSERT", "1"),
    (3, None, "delete", "2"),  # values match case-insensitively
]


def frame(spark, rows):
    return spark.createDataFrame(rows, SCHEMA)


def test_scd1_out_of_order_duplicated_deletes_and_truncate(spark, new_table):
    flow = autocdc.AutoCdcFlow(target=new_table("bq"), keys=["id"])
    reversed_and_resent = [*reversed(CHANGES), CHANGES[0], CHANGES[3]]
    first = flow.apply(frame(spark, reversed_and_resent[:3]))
    second = flow.apply(frame(spark, reversed_and_resent[3:]))
    assert_rows(spark, spark.table(flow.target), [(1, "a-late"), (2, "b-long")], TARGET)
    assert first.rows_in + second.rows_in == 8 and second.quarantined == 0

    # TRUNCATE at 0x17 removes every change below it, later ones stay, late ones stay dead.
    truncated = flow.apply(frame(spark, [(None, None, "TRUNCATE", "17"), (4, "d", "UPSERT", "18")]))
    flow.apply(frame(spark, [(5, "too late", "UPSERT", "16/FFFFFFFF")]))
    assert truncated.truncates == 1
    assert_rows(spark, spark.table(flow.target), [(4, "d")], TARGET)


def test_scd2_history_in_hex_order_and_truncate_quarantined(spark, new_table):
    flow = autocdc.AutoCdcFlow(target=new_table("bqh"), keys=["id"], stored_as_scd_type=2)
    flow.apply(frame(spark, list(reversed(CHANGES))[:4]))
    metrics = flow.apply(frame(spark, [*CHANGES[:3], (None, None, "TRUNCATE", "FF")]))
    assert metrics.quarantined == 1

    expected = spark.createDataFrame(
        [
            (1, "a-early", "9/FFFFFFFF", "16/B374D848"),
            (1, "a-late", "16/B374D848", None),
            (2, "b-short", "A", "A/0"),
            (2, "b-long", "A/0", None),
            (3, "c", "1", "2"),
        ],
        "id int, name string, s string, e string",
    ).select(
        "id",
        "name",
        autocdc.hex_sequence("s").alias("__START_AT"),
        autocdc.hex_sequence("e").alias("__END_AT"),
    )
    assert_rows(spark, spark.table(flow.target), expected.collect(), expected.schema)
    assert_rows(spark, flow.as_of(spark, "10/0"), [(1, "a-early"), (2, "b-long")], TARGET)
    with pytest.raises(autocdc.InvalidSequenceValueError):
        flow.as_of(spark, "10/G")
    reasons = spark.table(flow.quarantine_table).select("reason").collect()
    assert [r.reason for r in reasons] == [QUARANTINE_TRUNCATE_IN_SCD2]


def test_rows_the_change_columns_cannot_place_are_quarantined(spark, new_table):
    flow = autocdc.AutoCdcFlow(target=new_table("bqq"), keys=["id"])
    bad = {
        (6, "not hex", "UPSERT", "G1"): QUARANTINE_MALFORMED_SEQUENCE,
        (7, "five sections", "UPSERT", "1/2/3/4/5"): QUARANTINE_MALFORMED_SEQUENCE,
        (8, "17 digits", "UPSERT", "1" * 17): QUARANTINE_MALFORMED_SEQUENCE,
        (9, "empty section", "UPSERT", "1//2"): QUARANTINE_MALFORMED_SEQUENCE,
        (10, "no sequence", "UPSERT", None): QUARANTINE_NULL_SEQUENCE,
        (11, "unknown", "MERGE", "1"): QUARANTINE_UNKNOWN_CHANGE_TYPE,
        (12, "no type", None, "1"): QUARANTINE_UNKNOWN_CHANGE_TYPE,
        (None, "no key", "UPSERT", "1"): QUARANTINE_NULL_KEY,
    }
    metrics = flow.apply(frame(spark, [(13, "fine", "upsert", "1"), *bad]))
    assert metrics.quarantined == len(bad)
    assert_rows(spark, spark.table(flow.target), [(13, "fine")], TARGET)

    def row_json(row: tuple) -> str:
        names = ["id", "name", "_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER"]
        return json.dumps(dict(sorted(zip(names, row, strict=True))), separators=(",", ":"))

    assert_rows(
        spark,
        spark.table(flow.quarantine_table).select("reason", "row"),
        [(reason, row_json(row)) for row, reason in bad.items()],
        "reason string, row string",
    )


@pytest.mark.parametrize(
    ("sequence", "found"), [(None, None), ("_CHANGE_SEQUENCE_NUMBER bigint", "bigint")]
)
def test_feed_without_a_text_sequence_is_refused(spark, new_table, sequence, found):
    flow = autocdc.AutoCdcFlow(target=new_table("bqm"), keys=["id"])
    schema = ", ".join(c for c in ("id int", "_CHANGE_TYPE string", sequence) if c)
    feed = spark.createDataFrame([], schema)
    with pytest.raises(autocdc.MissingSequenceError) as err:
        flow.check(feed)
    assert err.value.params == {"type": found, "available": feed.columns}


FEED = StructType(
    [
        StructField("id", LongType()),
        StructField("_CHANGE_TYPE", StringType()),
        StructField("_CHANGE_SEQUENCE_NUMBER", StringType()),
    ]
)


@pytest.mark.parametrize(
    ("options", "stored"),
    [
        ({}, ["id"]),
        ({"column_list": ["id", "_CHANGE_SEQUENCE_NUMBER"]}, ["id", "_CHANGE_SEQUENCE_NUMBER"]),
        # An explicit sequence keeps today's behaviour: the columns are ordinary ones.
        ({"sequence_by": "id"}, ["id", "_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER"]),
    ],
)
def test_change_columns_are_stored_only_when_listed(options, stored):
    spec = autocdc.AutoCdcFlow(target="t", keys=["id"], **options)
    assert spec.resolve(FEED, LongType()).payload == stored


def test_explicit_options_ignore_the_change_type(spark, new_table):
    """With apply_as_deletes given, _CHANGE_TYPE is neither read nor checked."""
    flow = autocdc.AutoCdcFlow(target=new_table("bqe"), keys=["id"], apply_as_deletes="id = 3")
    flow.apply(frame(spark, [(1, "a", "MERGE", "1"), (3, "c", "UPSERT", "1")]))
    assert_rows(spark, spark.table(flow.target), [(1, "a")], TARGET)


def test_example_pipeline(spark, tmp_path, new_table):
    """pipelines/bigquery (Python SCD1 and SQL SCD2 flows with no sequence), on a copy."""
    database = new_table("bq_example")
    run(spark, copy_example(EXAMPLE, tmp_path / "bigquery", database))

    orders = [
        (1, "ada", "shipped", Decimal("30.00")),
        (2, "bob", "paid", Decimal("12.50")),
        (6, "fay", "placed", Decimal("21.00")),
    ]
    assert_rows(
        spark,
        spark.table(f"{database}.orders"),
        orders,
        "order_id bigint, customer string, status string, amount decimal(10,2)",
    )
    history = spark.table(f"{database}.orders_history").select(
        "order_id", "status", "__START_AT", "__END_AT"
    )
    versions = [
        (1, "placed", "9/FFFFFFFF", "16/B374D848"),
        (1, "shipped", "16/B374D848", None),
        (2, "placed", "A", "A/0"),
        (2, "paid", "A/0", None),
        (3, "placed", "B", "C"),
        (6, "placed", "1F", None),
    ]
    expected = spark.createDataFrame(versions, "order_id bigint, status string, s string, e string")
    expected = expected.select(
        "order_id",
        "status",
        autocdc.hex_sequence("s").alias("__START_AT"),
        autocdc.hex_sequence("e").alias("__END_AT"),
    )
    assert_rows(spark, history, expected.collect(), expected.schema)
    for flow in ("orders", "orders_history"):
        quarantine = spark.table(f"{database}.{flow}__autocdc_quarantine")
        assert_rows(
            spark,
            quarantine.select(
                F.get_json_object("row", "$.order_id").cast("int").alias("order_id"), "reason"
            ),
            [(4, QUARANTINE_MALFORMED_SEQUENCE), (5, QUARANTINE_UNKNOWN_CHANGE_TYPE)],
            "order_id int, reason string",
        )
