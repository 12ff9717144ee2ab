"""Malformed records: a line Spark cannot parse or type goes to the quarantine with its raw
text and AUTOCDC_MALFORMED_RECORD; the rest of the file is applied and the counts add up.

The identity every batch's metrics satisfy (each key here has at most one change that
takes effect per batch, so applied changes = upserted + deleted):

    rows_in = quarantined + duplicates_dropped + ignored_stale + truncates
              + upserted + deleted
"""

from __future__ import annotations

import json

import pytest
from changes import feed_flow
from chispa import assert_df_equality
from projects import PYSPARK_SCD1, run, write_project
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

import autocdc
from autocdc.engine.errors import QUARANTINE_MALFORMED_RECORD, QUARANTINE_NULL_KEY

MALFORMED, NULL_KEY = QUARANTINE_MALFORMED_RECORD, QUARANTINE_NULL_KEY
SCHEMA = "id INT, name STRING, n INT, op STRING, seq BIGINT, _corrupt_record STRING"
TARGET = "id INT, name STRING, n INT"
FIRST = [
    '{"id": 1, "name": "a", "n": 10, "op": "U", "seq": 5}',
    '{"id": 9, "name": "z", "n": 90, "op": "U", "seq": 5}',
]
# Each bad line would otherwise be NULL_KEY, NULL_SEQUENCE or, worst, applied with n NULL.
BAD = [
    '{"id": 3, "name": "c", "n": ',  # does not parse
    '{"id": 4, "name": "d", "n": "forty", "op": "U", "seq": 4}',  # n is not an INT
    '{"id": "five", "name": "e", "n": 5, "op": "U", "seq": 5}',  # the key is not an INT
    '{"id": 6, "name": "f", "n": 6, "op": "U", "seq": "abc"}',  # the sequence is not a BIGINT
]
MISSING_KEY = '{"name": "g", "n": 7, "op": "U", "seq": 7}'
MIXED = [
    '{"id": 1, "name": "old", "n": 0, "op": "U", "seq": 3}',  # older than the state of 1
    '{"id": 2, "name": "b", "n": 20, "op": "U", "seq": 2}',
    '{"id": 2, "name": "b", "n": 20, "op": "U", "seq": 2}',  # an exact duplicate
    '{"id": 9, "name": null, "n": null, "op": "D", "seq": 6}',
    *BAD,
    MISSING_KEY,
]


def write_lines(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def quarantined(spark, flow) -> set[tuple[str, str | None]]:
    """(reason, raw text) per quarantine row; the raw text is the corrupt column's value."""
    rows = spark.table(flow.quarantine_table).collect()
    return {(r.reason, json.loads(r.row)["_corrupt_record"]) for r in rows}


def assert_counts_add_up(m: autocdc.BatchMetrics) -> None:
    dropped = m.quarantined + m.duplicates_dropped + m.ignored_stale
    assert m.rows_in == dropped + m.truncates + m.upserted + m.deleted


@pytest.mark.parametrize("scd_type", [1, 2])
def test_json_file_mixing_good_and_bad_lines(spark, new_table, tmp_path, scd_type):
    flow = feed_flow(new_table("malformed"), scd_type)
    first = spark.read.schema(SCHEMA).json(write_lines(tmp_path / "first.json", FIRST))
    flow.apply(first)
    mixed = spark.read.schema(SCHEMA).json(write_lines(tmp_path / "mixed.json", MIXED))
    metrics = flow.apply(mixed)

    expected = spark.createDataFrame([(1, "a", 10), (2, "b", 20)], TARGET)
    assert_df_equality(flow.current(spark), expected, ignore_row_order=True, ignore_nullable=True)
    stored = spark.table(flow.target).columns + spark.table(flow.state_table).columns
    assert "_corrupt_record" not in stored
    assert quarantined(spark, flow) == {(MALFORMED, line) for line in BAD} | {(NULL_KEY, None)}
    null_key_row = spark.table(flow.quarantine_table).where(f"reason = '{NULL_KEY}'").first()
    missing_key = {"_corrupt_record": None, "id": None, "n": 7, "name": "g", "op": "U", "seq": 7}
    assert json.loads(null_key_row.row) == missing_key

    assert_counts_add_up(metrics)
    # Type 1 ignores the older change of key 1; type 2 splits key 1's history with it.
    stale, upserted = (1, 1) if scd_type == 1 else (0, 2)
    assert (
        metrics.rows_in,
        metrics.quarantined,
        metrics.duplicates_dropped,
        metrics.ignored_stale,
        metrics.upserted,
        metrics.deleted,
    ) == (len(MIXED), 5, 1, stale, upserted, 1)


def test_csv_wrong_type_and_column_list_naming_the_corrupt_column(spark, new_table, tmp_path):
    """A listed corrupt-record column is still never stored."""
    flow = autocdc.AutoCdcFlow(
        target=new_table("malformed_csv"),
        keys=["id"],
        sequence_by="seq",
        column_list=["id", "name", "n", "_corrupt_record"],
    )
    lines = ["id,name,n,op,seq", "1,a,10,U,1", "2,b,zz,U,2", "3,c,30,U"]
    path = write_lines(tmp_path / "mixed.csv", lines)
    metrics = flow.apply(spark.read.schema(SCHEMA).option("header", True).csv(path))

    expected = spark.createDataFrame([(1, "a", 10)], TARGET)
    assert_df_equality(spark.table(flow.target), expected, ignore_nullable=True)
    assert quarantined(spark, flow) == {(MALFORMED, "2,b,zz,U,2"), (MALFORMED, "3,c,30,U")}
    assert (metrics.rows_in, metrics.quarantined, metrics.upserted) == (3, 2, 1)


def test_resolve_never_stores_the_corrupt_column():
    schema = StructType(
        [StructField(c, t) for c, t in [("id", IntegerType()), ("_corrupt_record", StringType())]]
    )
    flow = autocdc.AutoCdcFlow(target="t", keys=["id"], sequence_by="id")
    columns = flow.resolve(schema, IntegerType(), never_stored=["_corrupt_record"])
    assert columns.payload == ["id"]


def test_pipeline_streaming_json_source_quarantines_malformed_lines(spark, tmp_path, new_table):
    database = new_table("pipe_malformed")
    feed = "id INT, a STRING, b INT, op STRING, seq BIGINT, _corrupt_record STRING"
    spec = write_project(tmp_path, database, {"feed.py": PYSPARK_SCD1.replace("{feed}", feed)})
    bad = '{"id": 2, "a": "x", "b": "two", "op": "U", "seq": 1}'
    good = '{"id": 1, "a": "y", "b": 1, "op": "U", "seq": 1}'
    (tmp_path / "data").mkdir()
    write_lines(tmp_path / "data" / "1.json", [good, bad, '{"id": 3, "a":'])
    run(spark, spec)

    assert [tuple(r) for r in spark.table(f"{database}.latest").collect()] == [(1, "y", 1)]
    q = spark.table(f"{database}.latest__autocdc_quarantine")
    assert {(r.reason, json.loads(r.row)["_corrupt_record"]) for r in q.collect()} == {
        (MALFORMED, bad),
        (MALFORMED, '{"id": 3, "a":'),
    }
