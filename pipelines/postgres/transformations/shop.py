"""The `shop` database's `customers` and `items` tables, mirrored through one slot.

One streaming query reads the slot (a slot has one reader) and appends every change to
`shop_changes`; the slot advances only after that append commits. Each table's flow then
reads its own rows from there, typed by the schema declared here.
"""

import os

from autocdc import pipelines as dp
from autocdc import postgres_table

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


for table, schema in SCHEMAS.items():
    dp.temporary_view(name=f"{table}_changes")(
        lambda table=table, schema=schema: postgres_table(
            spark.readStream.table("shop_changes"),  # noqa: F821
            table,
            schema,
        )
    )
    # `_CHANGE_TYPE` (UPSERT, DELETE, TRUNCATE) and `_CHANGE_SEQUENCE_NUMBER` (commit LSN,
    # then position in the transaction) drive the flow: no sequence_by, no apply_as_*.
    dp.create_streaming_table(table)
    dp.create_auto_cdc_flow(target=table, source=f"{table}_changes", keys=["id"])

# Every version of every item, in the order PostgreSQL committed them.
dp.create_streaming_table("items_history")
dp.create_auto_cdc_flow(
    target="items_history", source="items_changes", keys=["id"], stored_as_scd_type=2
)
