"""MySQL `shop.products` through Debezium into `products_history` (SCD type 2): every
version, ordered by binlog file, position and row, whatever the arrival order."""

import autocdc
from autocdc import pipelines as dp


@dp.temporary_view
def product_changes():
    events = spark.readStream.option("maxFilesPerTrigger", 1).text("data/mysql")  # noqa: F821
    return autocdc.debezium_changes(events, "id INT, name STRING, stock INT", "mysql")


dp.create_streaming_table("products_history")
dp.create_auto_cdc_flow(
    target="products_history",
    source="product_changes",
    keys=["id"],
    sequence_by=autocdc.hex_sequence("_CHANGE_SEQUENCE_NUMBER"),
    apply_as_deletes="_CHANGE_TYPE = 'DELETE'",
    except_column_list=["_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER"],
    stored_as_scd_type=2,
)
