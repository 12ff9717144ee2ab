"""Orders from BigQuery-style change rows (data/changes, one file per micro-batch) into a
clean `orders` table (SCD type 1): no sequence_by, no apply_as_deletes.

`_CHANGE_SEQUENCE_NUMBER` orders the changes ('/'-separated hex sections, compared as
numbers: "16/B374D848" is after "9/FFFFFFFF"), `_CHANGE_TYPE` says UPSERT or DELETE, and
neither column is stored in the target. A row whose sequence is malformed or whose change
type is unknown goes to `orders__autocdc_quarantine` with its reason.
"""

from autocdc import pipelines as dp

CHANGES = (
    "order_id BIGINT, customer STRING, status STRING, amount DECIMAL(10,2), "
    "_CHANGE_TYPE STRING, _CHANGE_SEQUENCE_NUMBER STRING"
)


@dp.temporary_view
def order_changes():
    return (
        spark.readStream.schema(CHANGES)  # noqa: F821 - `spark` is given to library files
        .option("maxFilesPerTrigger", 1)
        .json("data/changes")
    )


dp.create_streaming_table("orders")
dp.create_auto_cdc_flow(target="orders", source="order_changes", keys=["order_id"])
