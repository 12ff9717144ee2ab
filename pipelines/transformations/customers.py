"""A messy change feed (data/changes, one file per micro-batch) into a clean `customers`
table (SCD type 1), declared with autocdc's `dp`, which takes every AutoCdcFlow option."""

from autocdc import pipelines as dp

# `_corrupt_record` catches a line that does not parse or a field of the wrong type (Spark
# fills it only when the schema names it): autocdc quarantines such a line with its raw
# text as AUTOCDC_MALFORMED_RECORD, instead of applying its bad field as NULL.
CHANGES = "id INT, name STRING, city STRING, op STRING, seq BIGINT, _corrupt_record STRING"


@dp.temporary_view
def customer_changes():
    # Nothing arrives in sequence order; maxFilesPerTrigger makes each file its own batch.
    return (
        spark.readStream.schema(CHANGES)  # noqa: F821 - `spark` is given to library files
        .option("maxFilesPerTrigger", 1)
        .json("data/changes")
    )


dp.create_streaming_table("customers")
dp.create_auto_cdc_flow(
    target="customers",
    source="customer_changes",
    keys=["id"],
    sequence_by="seq",
    apply_as_deletes="op = 'D'",
    except_column_list=["op", "seq"],
    stored_as_scd_type=1,
)
