"""Sequence helpers: vendor positions ordered as numbers, not as strings."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

import autocdc


def test_parse_hex_sequence_orders_sections_as_numbers():
    assert autocdc.parse_hex_sequence("16/B374D848") == (22, 0xB374D848)
    assert autocdc.parse_hex_sequence("16/B374D848") > autocdc.parse_hex_sequence("9/FFFFFFFF")
    assert autocdc.parse_hex_sequence("1/0") < autocdc.parse_hex_sequence("1/0/0")


@pytest.mark.parametrize("bad", ["", "16/", "G/1", "1/2/3/4/5", "11111111111111111/1"])
def test_parse_hex_sequence_rejects_malformed(bad):
    with pytest.raises(autocdc.InvalidSequenceValueError) as err:
        autocdc.parse_hex_sequence(bad)
    assert err.value.params["value"] == bad


def test_spark_helpers_order_like_python(spark):
    lsns = ["9/FFFFFFFF", "16/B374D848", "16/B374D847", "1/0/0", "1/0"]
    df = spark.createDataFrame([(s,) for s in lsns], "lsn string")
    ordered = [r.lsn for r in df.orderBy(autocdc.hex_sequence("lsn")).collect()]
    assert ordered == sorted(lsns, key=autocdc.parse_hex_sequence)

    events = spark.createDataFrame(
        [
            (("mysql-bin.000002", 4, 0),),
            (("mysql-bin.000001", 900, 1),),
            (("mysql-bin.000001", 900, 0),),
        ],
        "source struct<file: string, pos: long, row: int>",
    )
    positions = events.orderBy(autocdc.debezium_sequence("mysql")).select(
        F.col("source.pos"), F.col("source.row")
    )
    assert [tuple(r) for r in positions.collect()] == [(900, 0), (900, 1), (4, 0)]
