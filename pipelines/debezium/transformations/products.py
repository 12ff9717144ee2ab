"""MySQL `shop.products` through Debezium into `products_history` (SCD type 2): every
version, ordered by binlog file, position and row, whatever the arrival order."""

import autocdc
from autocdc import pipelines as dp


@dp.temporary_view
def product_changes():
    events = spark.readStream.option("maxFilesPerTrigger", 1).text("data/mysql")  # noqa: F821
    return autocdc.debezium_changes(events, "id INT, name STRING, stock INT", "mysql")


dp.create_streaming_table("products_history")
# The change rows' `_CHANGE_TYPE` and `_CHANGE_SEQUENCE_NUMBER` drive the flow: no
# sequence_by or apply_as_deletes (see docs/sources.md, "BigQuery-style change rows").
dp.create_auto_cdc_flow(
    target="products_history",
    source="product_changes",
    keys=["id"],
    stored_as_scd_type=2,
)
