"""The `shop` database's `customers` and `items` tables, mirrored through one slot.

One streaming query reads the slot (a slot has one reader) and appends every change to
`shop_changes`; the slot advances only after that append commits. Each table's flow then
reads its own rows from there, typed by the schema declared here.
"""

import os

from autocdc import hex_sequence, postgres_table
from autocdc import pipelines as dp

DSN = os.environ.get("AUTOCDC_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=shop user=postgres")
SCHEMAS = {
    "customers": "id BIGINT, name STRING, city STRING",
    "items": "id BIGINT, sku STRING, quantity INT, price DECIMAL(10,2)",
}


@dp.table
def shop_changes():
    return (
        spark.readStream.format("postgres_cdc")  # noqa: F821 - `spark` is given to library files
        .option("dsn", DSN)
        .option("slot", "autocdc_shop")
        .option("tables", ",".join(SCHEMAS))
        .load()
    )


# The change rows say what they are (`_CHANGE_TYPE`) and where they were committed
# (`_CHANGE_SEQUENCE_NUMBER`: commit LSN, then position in the transaction).
CHANGE_ROWS = {
    "sequence_by": hex_sequence("_CHANGE_SEQUENCE_NUMBER"),
    "apply_as_deletes": "_CHANGE_TYPE = 'DELETE'",
    "except_column_list": ["_CHANGE_TYPE", "_CHANGE_SEQUENCE_NUMBER"],
}

for table, schema in SCHEMAS.items():
    dp.temporary_view(name=f"{table}_changes")(
        lambda table=table, schema=schema: postgres_table(
            spark.readStream.table("shop_changes"),  # noqa: F821
            table,
            schema,
        )
    )
    dp.create_streaming_table(table)
    dp.create_auto_cdc_flow(
        target=table,
        source=f"{table}_changes",
        keys=["id"],
        apply_as_truncates="_CHANGE_TYPE = 'TRUNCATE'",
        **CHANGE_ROWS,
    )

# Every version of every item, in the order PostgreSQL committed them.
dp.create_streaming_table("items_history")
dp.create_auto_cdc_flow(
    target="items_history",
    source="items_changes",
    keys=["id"],
    stored_as_scd_type=2,
    **CHANGE_ROWS,
)
